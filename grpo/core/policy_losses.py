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
from grpo.registry import Registry


@dataclass(frozen=True)
class LossInputs:
    """The tensors a policy loss reads, each [N, T] (advantages already broadcast to tokens).

    ``old_logp`` are the sampling policy's log-probs (pass ``logp.detach()`` with one optimizer step
    per batch, where pi_old = pi_theta); ``ref_logp`` the reference's (None without a reference);
    ``entropy`` the policy's token entropy (with a gradient where an entropy term needs one, else
    detached or None); ``keep`` 1 where a token's policy-gradient term counts and 0 where a token
    mask (core.token_masks) removes it, None for all: the KL and entropy terms and every denominator
    still count the masked tokens. ``weight``: the importance weights of the sampled tokens that
    ``advantages`` already carry (pi_train / pi_sampler: the engine-mismatch or stale-token correction;
    None: none), for a term that reads no advantage but estimates an expectation under pi_train from
    those tokens (distillation's reverse KL).
    """

    logp: Tensor  # [N, T]
    old_logp: Tensor  # [N, T]
    advantages: Tensor  # [N, T]
    mask: Tensor  # [N, T]
    ref_logp: Tensor | None = None  # [N, T]
    entropy: Tensor | None = None  # [N, T]
    keep: Tensor | None = None  # [N, T]
    weight: Tensor | None = None  # [N, T]


@dataclass(frozen=True)
class LossSettings:
    """Hyper-parameters of the policy losses (plain numbers and names; each loss reads those it uses).

    eps_low, eps_high: clip range of the ratio (eps_high > eps_low is DAPO's clip-higher, arXiv
    2503.14476); dual_clip: c > 1 or None (Ye et al. 2020); ratio_level: "token" or "sequence" (GSPO,
    Zheng et al. 2025); kl_coef, kl_estimator: the KL-to-reference term (DeepSeekMath eq. 3-4);
    aggregation, norm_length, total: see ``aggregate``; entropy_coef: weight of an entropy bonus;
    cov_mode, cov_fraction, kl_cov_coef: Clip-Cov / KL-Cov (Cui et al. 2025, arXiv 2505.22617);
    clip_delta: INTELLECT-2's upper bound on the ratio of negative-advantage tokens (clip loss);
    cispo_ratio_max: CISPO's cap on the importance weight; sapo_tau_pos, sapo_tau_neg: SAPO's gate
    temperatures; top_entropy_quantile, off_policy_mask_threshold: the token masks of
    core.token_masks, applied by core.policy_loss; distill_grpo_weight: the weight of GRPO's clipped
    surrogate beside the reverse KL of the distill loss (core.distill); vespo_k_pos, vespo_lambda_pos,
    vespo_k_neg, vespo_lambda_neg: the Gamma weight's shape by the advantage's sign (core.vespo).
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
    # loss variants
    clip_delta: float | None = None
    cispo_ratio_max: float = 5.0
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05
    top_entropy_quantile: float = 1.0
    off_policy_mask_threshold: float | None = None
    distill_grpo_weight: float = 0.0
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0


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


def _with_terms(loss_tok: Tensor, pg_tok: Tensor, x: LossInputs, s: LossSettings,
                out: dict[str, Tensor]) -> dict[str, Tensor]:
    """The parts every loss shares: the token masks (``x.keep``) on the policy-gradient terms, then
    + kl_coef * KL (DeepSeekMath eq. 3: its own loss term, not folded into the reward) and
    - entropy_coef * entropy on every counted token, aggregated. loss_tok, pg_tok: [N, T] (loss_tok is
    pg_tok plus any term of the loss's own). Adds "loss", "policy_loss", "kl" and "entropy" to ``out``."""
    mask = x.mask  # [N, T]
    if x.keep is not None:
        loss_tok, pg_tok = loss_tok * x.keep, pg_tok * x.keep  # [N, T] each
    if x.ref_logp is not None:
        kl_tok = kl_penalty(x.logp, x.ref_logp, estimator=s.kl_estimator)  # [N, T]
        loss_tok = loss_tok + s.kl_coef * kl_tok  # [N, T]
        out["kl"] = masked_mean(kl_tok.detach(), mask)
    else:
        out["kl"] = x.logp.new_zeros(())
    if x.entropy is not None:
        loss_tok = loss_tok - s.entropy_coef * x.entropy  # [N, T]
        out["entropy"] = masked_mean(x.entropy.detach(), mask)
    agg = dict(mode=s.aggregation, norm_length=s.norm_length, total=s.total)
    out["loss"] = aggregate(loss_tok, mask, **agg)
    out["policy_loss"] = aggregate(pg_tok.detach(), mask, **agg)
    return out


def clip_loss(inputs: LossInputs, settings: LossSettings) -> dict[str, Tensor]:
    """Clipped surrogate + kl_coef * KL - entropy_coef * entropy per token, then aggregated.

    inputs: [N, T] tensors (LossInputs). The surrogate is PPO's clipped ratio objective, with
    DAPO's asymmetric clip (arXiv 2503.14476) and the dual clip; the ratio is per token (GRPO) or
    per sequence (GSPO). KL is its own loss term (DeepSeekMath eq. 3), not folded into the reward.
    ``clip_delta`` = delta (INTELLECT-2, arXiv 2505.07291, "two-sided clipping"; TRL's ``delta``): on
    negative-advantage tokens the unclipped ratio is min(r, delta), which bounds their loss by
    delta * |A| with no gradient above it (the same value and gradient as dual_clip = delta).
    ``cov_mode`` (Cui et al. 2025, arXiv 2505.22617): on the ``cov_fraction`` of tokens with the
    largest covariance between logp and advantage, "clip_cov" removes the policy gradient and
    "kl_cov" adds kl_cov_coef * |logp - old_logp|.
    Returns a dict of 0-d tensors: "loss" (differentiable), "policy_loss", "kl", "entropy" (when
    given), "ratio_mean", "clip_fraction", "clip_fraction_low", "clip_fraction_high" (and
    "cov_token_share" with a cov_mode, "clip_fraction_delta" with clip_delta).
    """
    x, s = inputs, settings
    logp, old_logp, advantages, mask = x.logp, x.old_logp, x.advantages, x.mask  # [N, T] each
    ratio = torch.exp(log_ratio(logp, old_logp, mask, level=s.ratio_level))  # [N, T]
    pg_tok = clipped_surrogate(ratio, advantages, eps_low=s.eps_low, eps_high=s.eps_high,
                               dual_clip=s.dual_clip, delta=s.clip_delta)  # [N, T]
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
    if s.clip_delta is not None:
        over = ((ratio.detach() > s.clip_delta) & (advantages < 0)).to(logp.dtype)  # [N, T]
        out["clip_fraction_delta"] = masked_mean(over, mask)
    _with_terms(loss_tok, pg_tok, x, s, out)
    out["ratio_mean"] = masked_mean(ratio.detach(), mask)
    out.update(clip_fractions(ratio.detach(), advantages, mask, eps_low=s.eps_low, eps_high=s.eps_high))
    return out


def cispo_loss(inputs: LossInputs, settings: LossSettings) -> dict[str, Tensor]:
    """CISPO (MiniMax-M1, arXiv 2506.13585, eq. 4-5): clip the importance weight, not the update.

    J = 1 / sum_i |o_i| * sum_i sum_t sg(r^_it) A_it log pi_theta(o_it),  r^ = clip(r, 1 - eps_low^IS,
    1 + eps_high^IS). Every token keeps its gradient, -sg(r^) A d log pi: a token whose ratio is over
    the cap still learns, with the capped weight (PPO's clip would drop its gradient). As the paper
    (which sets no lower bound) and TRL's ``cispo`` (``torch.clamp(ratio, max=epsilon_high)``, the
    ScaleRL value 5.0 recommended) do, only an upper cap, ``cispo_ratio_max``, is applied. The paper
    normalises by the batch's tokens (aggregation=token_mean); every aggregation is accepted.
    inputs: [N, T] tensors. Returns "loss", "policy_loss", "kl", "entropy" (when given), "ratio_mean",
    and "clip_fraction" (= "clip_fraction_high": tokens whose weight was capped; "clip_fraction_low" 0).
    """
    x, s = inputs, settings
    ratio = torch.exp(log_ratio(x.logp, x.old_logp, x.mask, level=s.ratio_level)).detach()  # [N, T]
    weight = ratio.clamp(max=s.cispo_ratio_max)  # [N, T] sg(r^)
    pg_tok = -weight * x.advantages * x.logp  # [N, T]
    out: dict[str, Tensor] = {}
    _with_terms(pg_tok, pg_tok, x, s, out)
    capped = masked_mean((ratio > s.cispo_ratio_max).to(x.logp.dtype), x.mask)  # []
    out.update(ratio_mean=masked_mean(ratio, x.mask), clip_fraction=capped, clip_fraction_high=capped,
               clip_fraction_low=torch.zeros_like(capped))
    return out


def sapo_loss(inputs: LossInputs, settings: LossSettings) -> dict[str, Tensor]:
    """SAPO (Soft Adaptive Policy Optimization, Gao et al. 2025, arXiv 2511.20347): a soft gate
    in place of the hard clip.

    Per token -f(r) A with f(r) = sigmoid(tau (r - 1)) * 4 / tau, tau = tau_pos where A > 0 and tau_neg
    otherwise. The gradient is -A w(r) d r with w = 4 s (1 - s), s = sigmoid(tau (r - 1)): exactly the
    plain policy gradient on-policy (w(1) = 1), decaying smoothly as r leaves 1, faster for larger tau
    (tau_neg > tau_pos damps negative-advantage tokens more, which the paper finds steadier). The
    temperatures and their defaults (1.0, 1.05) are TRL's ``sapo_temperature_pos`` and
    ``sapo_temperature_neg``. inputs: [N, T]. Returns "loss", "policy_loss", "kl", "entropy" (when
    given), "ratio_mean", and "sapo_gate_mean" (the mean of w, 1 on-policy).
    """
    x, s = inputs, settings
    ratio = torch.exp(log_ratio(x.logp, x.old_logp, x.mask, level=s.ratio_level))  # [N, T]
    tau = torch.full_like(ratio, s.sapo_tau_neg).masked_fill(x.advantages > 0, s.sapo_tau_pos)  # [N, T]
    gate = torch.sigmoid(tau * (ratio - 1.0))  # [N, T]
    pg_tok = -(gate * 4.0 / tau) * x.advantages  # [N, T]
    out: dict[str, Tensor] = {}
    _with_terms(pg_tok, pg_tok, x, s, out)
    g = gate.detach()
    out.update(ratio_mean=masked_mean(ratio.detach(), x.mask), sapo_gate_mean=masked_mean(4.0 * g * (1.0 - g), x.mask))
    return out


def gmpo_loss(inputs: LossInputs, settings: LossSettings) -> dict[str, Tensor]:
    """GMPO (Geometric-Mean Policy Optimization, Zhao et al. 2025, arXiv 2507.20673, eq. 5): the
    geometric mean of the token ratios of a sequence, clipped token by token in log space.

    J = 1/G sum_i A_i * exp(1/|o_i| sum_t sgn(A_i) min(sgn(A_i) l_it, sgn(A_i) clip(l_it, -eps_low, eps_high)))
    with l = log pi_theta - log pi_old: the pessimistic bound of PPO on the log ratio, then the mean
    over the sequence's tokens, so one outlier token moves the sequence's ratio by its 1/|o_i|-th
    power only. As verl's ``geo_mean`` does, eps_low and eps_high (epsilon, epsilon_high) are the
    log-space bounds (the paper uses 0.4: clip(r, e^-0.4, e^0.4)), and A_i is the sequence's mean
    token advantage. The sequence loss -A_i * ratio_i is put on each of its tokens, so the default
    aggregation (seq_mean_token_mean) is the paper's 1/G sum_i; the ratio level is always the
    sequence. inputs: [N, T]. Returns "loss", "policy_loss", "kl", "entropy" (when given), "ratio_mean"
    (the mean over sequences of the unclipped geometric-mean ratio) and "clip_fraction" (low: A < 0 and l < -eps_low; high: A > 0 and l > eps_high).
    """
    x, s = inputs, settings
    lr = x.logp - x.old_logp  # [N, T]
    sgn = torch.sign(x.advantages)  # [N, T]
    pessimistic = sgn * torch.minimum(sgn * lr, sgn * lr.clamp(-s.eps_low, s.eps_high))  # [N, T]
    # a token mask (x.keep) takes its tokens out of the geometric mean too, so they get no gradient
    counted = x.mask if x.keep is None else x.mask * x.keep  # [N, T]
    seq_ratio = torch.exp(masked_mean(pessimistic, counted, dim=1))  # [N]
    seq_adv = masked_mean(x.advantages, x.mask, dim=1)  # [N]
    pg_tok = (-seq_adv * seq_ratio)[:, None].expand_as(x.logp)  # [N, T]
    out: dict[str, Tensor] = {}
    _with_terms(pg_tok, pg_tok, x, s, out)
    lr_d = lr.detach()
    low = masked_mean(((lr_d < -s.eps_low) & (x.advantages < 0)).to(lr.dtype), x.mask)  # []
    high = masked_mean(((lr_d > s.eps_high) & (x.advantages > 0)).to(lr.dtype), x.mask)  # []
    geo = torch.exp(masked_mean(lr_d, x.mask, dim=1))  # [N] the unclipped geometric-mean ratio
    has_tokens = (x.mask.sum(1) > 0).to(lr.dtype)  # [N]
    out.update(ratio_mean=(geo * has_tokens).sum() / has_tokens.sum().clamp(min=1),
               clip_fraction_low=low, clip_fraction_high=high, clip_fraction=low + high)
    return out


def _terms_zero_advantage_has_gradient(s: LossSettings) -> bool:
    """A zero-advantage sequence's policy-gradient term is 0 with a zero gradient in every loss here
    (A multiplies it); a KL or entropy term gives it a gradient of its own, and the high-entropy mask
    ranks tokens over the whole micro-batch, so its presence moves the other sequences' selection.
    Settings only: no shapes."""
    return s.kl_coef > 0 or s.entropy_coef > 0 or s.top_entropy_quantile < 1.0


def _clip_zero_advantage_has_gradient(s: LossSettings) -> bool:
    """Clip loss: as every loss (_terms_zero_advantage_has_gradient), and a covariance mode ranks
    tokens (and their means) over the whole micro-batch too. Settings only: no shapes."""
    return _terms_zero_advantage_has_gradient(s) or s.cov_mode is not None


def _entry(fn, zero_advantage=_terms_zero_advantage_has_gradient) -> PolicyLoss:
    """A loss that reads old_logp, the reference where kl_coef != 0 and the entropy's gradient where
    entropy_coef > 0 (settings only: no shapes)."""
    return PolicyLoss(fn=fn, needs_old_logp=True, needs_ref_logp=lambda s: s.kl_coef != 0.0,
                      needs_entropy=lambda s: s.entropy_coef > 0, zero_advantage_has_gradient=zero_advantage)


POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss", field="policy_loss")
POLICY_LOSSES.register("clip", _entry(clip_loss, _clip_zero_advantage_has_gradient))
# loss variants
POLICY_LOSSES.register("cispo", _entry(cispo_loss))
POLICY_LOSSES.register("sapo", _entry(sapo_loss))
POLICY_LOSSES.register("gmpo", _entry(gmpo_loss))


def get_policy_loss(name: str) -> PolicyLoss:
    """Look a policy loss up by name; an unknown name lists the valid ones.

    The entry's fn maps LossInputs ([N, T] tensors) to a dict of 0-d tensors (module docstring).
    """
    return POLICY_LOSSES[name]
