"""Policy losses: per-token log-probs of a batch and its advantages -> a scalar loss and its metrics.

Dimension letters: B prompts, G group size, N = B*G sequences, T completion tokens.

Every entry of ``POLICY_LOSSES`` is a ``PolicyLoss``: a function with one signature::

    fn(inputs: LossInputs, settings: LossSettings) -> dict of 0-d tensors

plus declarations of what it reads and when a sequence whose advantage is 0 on every token still
matters to the gradient, so the trainer picks a loss by name and never special-cases it. The dict
holds "loss" (differentiable) and "policy_loss" (the surrogate part, detached); every other key is
a detached diagnostic the trainer logs as a token-weighted mean. A new loss adds a function, a
``PolicyLoss`` and, for a new hyper-parameter, a field of ``LossSettings`` with a default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from grpo.core.losses import _check_choice, aggregate, clipped_surrogate, kl_penalty, log_ratio, masked_mean
from grpo.core.metrics import clip_fractions
from grpo.core.stability import COV_MODES, high_covariance_tokens


@dataclass(frozen=True)
class LossInputs:
    """The tensors a policy loss reads, each [N, T] (advantages already broadcast to tokens).

    ``old_logp`` are the sampling policy's log-probs (pass ``logp.detach()`` with one optimizer step
    per batch, where pi_old = pi_theta); ``ref_logp`` the reference's (None without a reference);
    ``entropy`` the policy's token entropy (with a gradient where an entropy term needs one, else
    detached or None).
    """

    logp: Tensor  # [N, T]
    old_logp: Tensor  # [N, T]
    advantages: Tensor  # [N, T]
    mask: Tensor  # [N, T]
    ref_logp: Tensor | None = None  # [N, T]
    entropy: Tensor | None = None  # [N, T]


@dataclass(frozen=True)
class LossSettings:
    """Hyper-parameters of the policy losses (plain numbers and names; each loss reads those it uses).

    eps_low, eps_high: clip range of the ratio (eps_high > eps_low is DAPO's clip-higher, arXiv
    2503.14476); dual_clip: c > 1 or None (Ye et al. 2020); ratio_level: "token" or "sequence" (GSPO,
    Zheng et al. 2025); kl_coef, kl_estimator: the KL-to-reference term (DeepSeekMath eq. 3-4);
    aggregation, norm_length, total: see ``aggregate``; entropy_coef: weight of an entropy bonus;
    cov_mode, cov_fraction, kl_cov_coef: Clip-Cov / KL-Cov (Cui et al. 2025, arXiv 2505.22617).
    """

    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = None
    ratio_level: str = "token"
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    aggregation: str = "seq_mean_token_mean"
    norm_length: int | None = None
    total: Tensor | float | None = None
    entropy_coef: float = 0.0
    cov_mode: str | None = None
    cov_fraction: float = 0.002
    kl_cov_coef: float = 1.0


@dataclass(frozen=True)
class PolicyLoss:
    """A registry entry: the loss and what the trainer must know about it without looking inside.

    fn: (LossInputs, LossSettings) -> dict of 0-d tensors (see the module docstring).
    needs_old_logp: the loss reads the sampling policy's log-probs (a ratio pi_theta / pi_old).
    needs_ref_logp(settings): the loss needs the reference's log-probs under these settings.
    needs_entropy(settings): the loss needs the token entropy with its gradient under these settings
      (the entropy is still reported when it is given without one).
    zero_advantage_has_gradient(settings): a sequence whose advantage is 0 on every token can change
      the step's gradient under these settings, through a gradient of its own (a KL or entropy term)
      or through the other sequences' loss (a selection of tokens ranked over the micro-batch). When
      False, such sequences may skip the forward and backward passes (if the loss's denominator
      still counts them) without changing the update.
    """

    fn: Callable[[LossInputs, LossSettings], dict[str, Tensor]]
    needs_old_logp: bool
    needs_ref_logp: Callable[[LossSettings], bool]
    needs_entropy: Callable[[LossSettings], bool]
    zero_advantage_has_gradient: Callable[[LossSettings], bool]


def clip_loss(inputs: LossInputs, settings: LossSettings) -> dict[str, Tensor]:
    """Clipped surrogate + kl_coef * KL - entropy_coef * entropy per token, then aggregated.

    inputs: [N, T] tensors (LossInputs). The surrogate is PPO's clipped ratio objective, with
    DAPO's asymmetric clip (arXiv 2503.14476) and the dual clip; the ratio is per token (GRPO) or
    per sequence (GSPO). KL is its own loss term (DeepSeekMath eq. 3), not folded into the reward.
    ``cov_mode`` (Cui et al. 2025, arXiv 2505.22617): on the ``cov_fraction`` of tokens with the
    largest covariance between logp and advantage, "clip_cov" removes the policy gradient and
    "kl_cov" adds kl_cov_coef * |logp - old_logp|.
    Returns a dict of 0-d tensors: "loss" (differentiable), "policy_loss", "kl", "entropy" (when
    given), "ratio_mean", "clip_fraction", "clip_fraction_low", "clip_fraction_high" (and
    "cov_token_share" with a cov_mode).
    """
    x, s = inputs, settings
    logp, old_logp, advantages, mask = x.logp, x.old_logp, x.advantages, x.mask  # [N, T] each
    ratio = torch.exp(log_ratio(logp, old_logp, mask, level=s.ratio_level))  # [N, T]
    pg_tok = clipped_surrogate(ratio, advantages, eps_low=s.eps_low, eps_high=s.eps_high,
                               dual_clip=s.dual_clip)  # [N, T]
    loss_tok = pg_tok  # [N, T]
    out: dict[str, Tensor] = {}
    if s.cov_mode is not None:
        _check_choice("cov_mode", s.cov_mode, COV_MODES)
        sel = high_covariance_tokens(logp, advantages, mask, fraction=s.cov_fraction)  # [N, T]
        if s.cov_mode == "clip_cov":
            loss_tok = torch.where(sel, pg_tok.detach(), pg_tok)  # [N, T]
        else:
            loss_tok = loss_tok + s.kl_cov_coef * sel * (logp - old_logp).abs()  # [N, T]
        out["cov_token_share"] = masked_mean(sel.to(logp.dtype), mask)
    if x.ref_logp is not None:
        kl_tok = kl_penalty(logp, x.ref_logp, estimator=s.kl_estimator)  # [N, T]
        loss_tok = loss_tok + s.kl_coef * kl_tok  # [N, T]
        out["kl"] = masked_mean(kl_tok.detach(), mask)
    else:
        out["kl"] = logp.new_zeros(())
    if x.entropy is not None:
        loss_tok = loss_tok - s.entropy_coef * x.entropy  # [N, T]
        out["entropy"] = masked_mean(x.entropy.detach(), mask)
    agg = dict(mode=s.aggregation, norm_length=s.norm_length, total=s.total)
    out["loss"] = aggregate(loss_tok, mask, **agg)
    out["policy_loss"] = aggregate(pg_tok.detach(), mask, **agg)
    out["ratio_mean"] = masked_mean(ratio.detach(), mask)
    out.update(clip_fractions(ratio.detach(), advantages, mask, eps_low=s.eps_low, eps_high=s.eps_high))
    return out


def _clip_zero_advantage_has_gradient(s: LossSettings) -> bool:
    """Clip loss: a zero-advantage sequence's surrogate is 0 with a zero gradient; a KL or entropy term
    gives it a gradient of its own, and a covariance mode ranks tokens (and their means) over the
    whole micro-batch, so its presence moves the other sequences' selection. Settings only: no shapes."""
    return s.kl_coef > 0 or s.entropy_coef > 0 or s.cov_mode is not None


POLICY_LOSSES: dict[str, PolicyLoss] = {
    "clip": PolicyLoss(fn=clip_loss, needs_old_logp=True,
                       needs_ref_logp=lambda s: s.kl_coef != 0.0,
                       needs_entropy=lambda s: s.entropy_coef > 0,
                       zero_advantage_has_gradient=_clip_zero_advantage_has_gradient),
}


def get_policy_loss(name: str) -> PolicyLoss:
    """Look a policy loss up by name; an unknown name lists the valid ones.

    The entry's fn maps LossInputs ([N, T] tensors) to a dict of 0-d tensors (module docstring).
    """
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown policy loss {name!r}; valid: {sorted(POLICY_LOSSES)}") from None
