"""The GRPO objective assembled from the pieces in advantages.py, policy_losses.py and metrics.py.

Dimension letters: B prompts, G group size, N = B*G sequences, T completion tokens.
Sequences are laid out group by group: sequence n belongs to prompt n // G.
"""

from __future__ import annotations

from torch import Tensor

from grpo.core.advantages import compute_advantages
from grpo.core.metrics import reward_stats, zero_variance_share
from grpo.core.policy_losses import LossInputs, LossSettings, get_policy_loss
from grpo.core.token_masks import policy_gradient_keep


def policy_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, name: str = "clip",
                ref_logp: Tensor | None = None, entropy: Tensor | None = None, weight: Tensor | None = None,
                settings: LossSettings | None = None, **fields) -> dict[str, Tensor]:
    """The policy loss ``POLICY_LOSSES[name]`` (default "clip": the clipped surrogate of GRPO,
    DeepSeekMath eq. 3, with DAPO's clip-higher, the dual clip, GSPO's sequence ratio, the KL and
    entropy terms and Clip-Cov / KL-Cov) on one batch.

    logp, old_logp, advantages, mask: [N, T] (advantages already broadcast to tokens);
    ref_logp: [N, T] or None (needed when the loss has a KL term); entropy: [N, T] or None;
    weight: [N, T] the importance weights already in ``advantages`` (LossInputs.weight), or None.
    ``settings``: the loss's hyper-parameters; or, without it, the keyword ``fields`` of
    ``LossSettings`` (an unknown one is a TypeError).
    The token masks of core.token_masks (``top_entropy_quantile``, ``off_policy_mask_threshold``)
    reach every entry as ``LossInputs.keep``, and their shares join the metrics.
    Returns the entry's dict of 0-d tensors: "loss" (differentiable), "policy_loss" and its metrics.
    """
    entry = get_policy_loss(name)
    if settings is not None and fields:
        raise TypeError(f"policy_loss: settings and keyword fields {sorted(fields)} given together")
    s = settings if settings is not None else LossSettings(**fields)
    if ref_logp is None and entry.needs_ref_logp(s):
        raise ValueError(f"policy_loss: {name!r} with kl_coef = {s.kl_coef} needs ref_logp")
    keep, mask_metrics = policy_gradient_keep(logp, old_logp, advantages, mask, entropy,
                                              top_entropy_quantile=s.top_entropy_quantile,
                                              off_policy_mask_threshold=s.off_policy_mask_threshold)
    inputs = LossInputs(logp, old_logp, advantages, mask, ref_logp=ref_logp, entropy=entropy, keep=keep,
                        weight=weight)
    return {**entry.fn(inputs, s), **mask_metrics}


def grpo_loss(logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None, rewards: Tensor, mask: Tensor, *,
              eps_low: float = 0.2, eps_high: float = 0.2, kl_coef: float = 0.04, kl_estimator: str = "k3",
              aggregation: str = "seq_mean_token_mean", std_eps: float = 1e-6, estimator: str = "grpo",
              unbiased_std: bool = True, ratio_level: str = "token", dual_clip: float | None = None,
              norm_length: int | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """GRPO with outcome supervision, DeepSeekMath equation (3), negated for minimisation.

    logp, old_logp, ref_logp, mask: [N, T]; rewards: [B, G] with N = B * G.
    With the defaults: A_i = (r_i - mean(r)) / (std(r) + eps) within each group, broadcast to all
    tokens of o_i; per token -min(rho A, clip(rho, 1 - eps, 1 + eps) A) + beta * k3 KL; averaged over
    each sequence's tokens, then over sequences. Returns (loss, metrics) where metrics holds 0-d
    tensors "loss", "policy_loss", "kl", "clip_fraction" (and its low/high parts), "reward_mean",
    "reward_std", "zero_variance_share", "ratio_mean".
    """
    b, g = rewards.shape
    if logp.shape[0] != b * g:
        raise ValueError(f"grpo_loss: logp has {logp.shape[0]} sequences but rewards is [B={b}, G={g}]")
    adv = compute_advantages(rewards, estimator=estimator, std_eps=std_eps, unbiased_std=unbiased_std)  # [B, G]
    adv_tok = adv.reshape(b * g, 1).expand_as(logp)  # [N, T]
    out = policy_loss(logp, old_logp, adv_tok, mask, ref_logp=ref_logp, eps_low=eps_low, eps_high=eps_high,
                      dual_clip=dual_clip, ratio_level=ratio_level, kl_coef=kl_coef,
                      kl_estimator=kl_estimator, aggregation=aggregation, norm_length=norm_length)
    out.update(reward_stats(rewards))
    out["zero_variance_share"] = zero_variance_share(rewards)
    loss = out["loss"]
    out["loss"] = loss.detach()
    return loss, out
