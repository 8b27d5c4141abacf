"""Tensor math of the stability tools: which groups, sequences and tokens a step trains on.

Dimension letters: B prompts, G group size, N = B*G sequences (group by group), T completion tokens.
All functions are pure: tensors in, settings as keyword-only arguments, tensors out.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from grpo.core.losses import _check_choice

PF_MODES = ("best_worst", "variance")
COV_MODES = ("clip_cov", "kl_cov")


def informative_groups(rewards: Tensor) -> Tensor:
    """DAPO dynamic sampling (Yu et al. 2025, arXiv 2503.14476, eq. 11): keep a group only when its
    rewards are not all equal, i.e. 0 < #correct < G. NaN rewards (failed calls) are ignored; a group
    with fewer than two finite rewards carries no signal either.

    rewards: [B, G] -> keep [B] bool.
    """
    finite = torch.isfinite(rewards)  # [B, G]
    hi = torch.where(finite, rewards, torch.full_like(rewards, -math.inf)).amax(dim=1)  # [B]
    lo = torch.where(finite, rewards, torch.full_like(rewards, math.inf)).amin(dim=1)  # [B]
    return (finite.sum(dim=1) >= 2) & (hi > lo)


def overlong_penalty(lengths: Tensor, *, max_length: int, buffer: int) -> Tensor:
    """DAPO soft overlong punishment (arXiv 2503.14476, eq. 13), added to the reward.

    lengths: [N] completion lengths in tokens -> [N] penalty in [-1, 0]:
      0                                  when |y| <= L_max - L_cache
      ((L_max - L_cache) - |y|) / L_cache when L_max - L_cache < |y| <= L_max
      -1                                 when |y| > L_max
    with L_max = ``max_length`` and L_cache = ``buffer`` (the linear ramp's width).
    """
    if buffer < 1 or buffer > max_length:
        raise ValueError(f"overlong buffer must lie in [1, max_length={max_length}], got {buffer}")
    start = max_length - buffer
    ramp = (start - lengths.float()) / buffer  # [N]
    return ramp.clamp(min=-1.0, max=0.0)


def policy_filter(rewards: Tensor, *, mode: str, min_std: float = 0.0) -> Tensor:
    """PF-PPO policy filtration (Zhang et al. 2024, "Policy Filtration in RLHF", arXiv 2409.06957):
    train only on samples whose reward is a reliable signal.

    rewards: [B, G] (NaN = a failed reward, which is never kept and never counts) -> keep [B, G] bool.
      best_worst  keep in each group the completions with the highest and the lowest reward (the
                  paper's BW filter: the extremes of the reward model are where it is most reliable)
      variance    keep whole groups whose reward std (population, over the valid rewards) is >= ``min_std``
    """
    _check_choice("policy_filter", mode, PF_MODES)
    valid = ~torch.isnan(rewards)  # [B, G]
    if mode == "variance":
        n = valid.sum(1).clamp(min=1)  # [B]
        mean = torch.where(valid, rewards, 0.0).sum(1) / n  # [B]
        var = torch.where(valid, (rewards - mean[:, None]) ** 2, 0.0).sum(1) / n  # [B]
        return (var.sqrt() >= min_std)[:, None] & valid  # [B, G]
    hi = torch.where(valid, rewards, -torch.inf).amax(dim=1, keepdim=True)  # [B, 1]
    lo = torch.where(valid, rewards, torch.inf).amin(dim=1, keepdim=True)  # [B, 1]
    return valid & ((rewards == hi) | (rewards == lo))


def token_covariance(logp: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """Per-token centred product (logp - mean logp) * (A - mean A) over the masked tokens, whose mean
    is the covariance that drives entropy change (Cui et al. 2025, "The Entropy Mechanism of RL for
    Reasoning LMs", arXiv 2505.22617, eq. 10-11). logp, advantages, mask: [N, T] -> [N, T] (0 off mask).
    """
    m = mask.to(logp.dtype)  # [N, T]
    count = m.sum().clamp(min=1)  # []
    lp = logp.detach()  # [N, T]
    lp_mean = (lp * m).sum() / count  # []
    adv_mean = (advantages * m).sum() / count  # []
    return (lp - lp_mean) * (advantages - adv_mean) * m  # [N, T]


def high_covariance_tokens(logp: Tensor, advantages: Tensor, mask: Tensor, *, fraction: float) -> Tensor:
    """The ``fraction`` of masked tokens with the largest covariance term (at least one token when
    fraction > 0 and some token has a positive term; only tokens with a positive term are chosen).

    logp, advantages, mask: [N, T] -> selected [N, T] bool. Clip-Cov detaches these tokens from the
    policy gradient, KL-Cov puts a KL penalty on them (arXiv 2505.22617, section 4). The paper's
    Clip-Cov draws its tokens at random from a covariance range; this is the deterministic top-k.
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"covariance fraction must lie in [0, 1], got {fraction}")
    cov = token_covariance(logp, advantages, mask)  # [N, T]
    if fraction == 0:
        return torch.zeros_like(mask, dtype=torch.bool)
    k = (fraction * mask.sum()).round().clamp(min=1)  # [] a tensor: no device sync
    scores = cov.masked_fill(mask == 0, -math.inf).flatten()  # [N*T]
    rank = torch.empty_like(scores, dtype=torch.long)  # [N*T] 0 = largest term
    rank[scores.argsort(descending=True, stable=True)] = torch.arange(scores.numel(), device=scores.device)
    return (rank.view_as(cov) < k) & (mask != 0) & (cov > 0)


def reward_cv(rewards: Tensor, *, eps: float = 1e-8) -> Tensor:
    """Coefficient of variation std / |mean| of each prompt's G rewards (population std): 0 when a
    prompt always gets the same reward. rewards: [B, G] -> [B]."""
    return rewards.std(dim=1, correction=0) / rewards.mean(dim=1).abs().clamp(min=eps)


REWARD_TRANSFORMS = ("none", "sigmoid", "group_minmax")


def transform_scores(scores: Tensor, group: Tensor, *, mode: str, eps: float = 1e-8) -> Tensor:
    """Seed 003 section 4.1: raw reward-model logits (often in [-50, 50]) make un-normalised group
    advantages explode; map them first. ``sigmoid``: into (0, 1); ``group_minmax``:
    (r - group min) / (group max - group min + eps) within each group; ``none``: unchanged.
    scores: [N]; group: [N] integer group index of each score -> [N]."""
    if mode == "none":
        return scores
    if mode == "sigmoid":
        return torch.sigmoid(scores)  # [N]
    if mode != "group_minmax":
        raise ValueError(f"unknown reward transform {mode!r}; valid: {list(REWARD_TRANSFORMS)}")
    n_groups = int(group.max()) + 1 if group.numel() else 0
    lo = torch.full((n_groups,), torch.inf, dtype=scores.dtype).scatter_reduce(0, group, scores, "amin")  # [B]
    hi = torch.full((n_groups,), -torch.inf, dtype=scores.dtype).scatter_reduce(0, group, scores, "amax")  # [B]
    return (scores - lo[group]) / (hi[group] - lo[group] + eps)  # [N]
