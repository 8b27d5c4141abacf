"""The GRPO objective assembled from the pieces in advantages.py, losses.py and metrics.py.

Dimension letters: B prompts, G group size, N = B*G sequences, T completion tokens.
Sequences are laid out group by group: sequence n belongs to prompt n // G.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpo.core.advantages import compute_advantages
from grpo.core.losses import _check_choice, aggregate, clipped_surrogate, kl_penalty, log_ratio, masked_mean
from grpo.core.metrics import clip_fractions, reward_stats, zero_variance_share
from grpo.core.stability import COV_MODES, high_covariance_tokens


def policy_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
                ref_logp: Tensor | None = None, eps_low: float = 0.2, eps_high: float = 0.2,
                dual_clip: float | None = None, ratio_level: str = "token", kl_coef: float = 0.0,
                kl_estimator: str = "k3", aggregation: str = "seq_mean_token_mean",
                norm_length: int | None = None, total: Tensor | float | None = None,
                entropy: Tensor | None = None, entropy_coef: float = 0.0, cov_mode: str | None = None,
                cov_fraction: float = 0.002, kl_cov_coef: float = 1.0) -> dict[str, Tensor]:
    """Clipped surrogate + kl_coef * KL - entropy_coef * entropy per token, then aggregated.

    logp, old_logp, advantages, mask: [N, T] (advantages already broadcast to tokens);
    ref_logp: [N, T] or None (needed when kl_coef != 0); entropy: [N, T] or None.
    KL is its own loss term (DeepSeekMath eq. 3), not folded into the reward.
    ``cov_mode`` (Cui et al. 2025, arXiv 2505.22617): on the ``cov_fraction`` of tokens with the largest
    covariance between logp and advantage, "clip_cov" removes the policy gradient and "kl_cov" adds
    kl_cov_coef * |logp - old_logp|.
    Returns a dict of 0-d tensors: "loss" (differentiable), "policy_loss", "kl", "entropy",
    "ratio_mean", "clip_fraction", "clip_fraction_low", "clip_fraction_high" (and "cov_token_share").
    """
    if kl_coef != 0.0 and ref_logp is None:
        raise ValueError("policy_loss: kl_coef != 0 needs ref_logp")
    ratio = torch.exp(log_ratio(logp, old_logp, mask, level=ratio_level))  # [N, T]
    pg_tok = clipped_surrogate(ratio, advantages, eps_low=eps_low, eps_high=eps_high,
                               dual_clip=dual_clip)  # [N, T]
    loss_tok = pg_tok  # [N, T]
    out: dict[str, Tensor] = {}
    if cov_mode is not None:
        _check_choice("cov_mode", cov_mode, COV_MODES)
        sel = high_covariance_tokens(logp, advantages, mask, fraction=cov_fraction)  # [N, T]
        if cov_mode == "clip_cov":
            loss_tok = torch.where(sel, pg_tok.detach(), pg_tok)
        else:
            loss_tok = loss_tok + kl_cov_coef * sel * (logp - old_logp).abs()
        out["cov_token_share"] = masked_mean(sel.to(logp.dtype), mask)
    if ref_logp is not None:
        kl_tok = kl_penalty(logp, ref_logp, estimator=kl_estimator)  # [N, T]
        loss_tok = loss_tok + kl_coef * kl_tok
        out["kl"] = masked_mean(kl_tok.detach(), mask)
    else:
        out["kl"] = logp.new_zeros(())
    if entropy is not None:
        loss_tok = loss_tok - entropy_coef * entropy
        out["entropy"] = masked_mean(entropy.detach(), mask)
    agg = dict(mode=aggregation, norm_length=norm_length, total=total)
    out["loss"] = aggregate(loss_tok, mask, **agg)
    out["policy_loss"] = aggregate(pg_tok.detach(), mask, **agg)
    out["ratio_mean"] = masked_mean(ratio.detach(), mask)
    out.update(clip_fractions(ratio.detach(), advantages, mask, eps_low=eps_low, eps_high=eps_high))
    return out


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
