"""Diagnostics of a GRPO step, as tensors (the trainer turns them into numbers once per step).

Dimension letters: B prompts, G group size, N = B*G sequences, T completion tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpo.core.losses import masked_mean, masked_moments


def clip_fractions(ratio: Tensor, advantages: Tensor, mask: Tensor, *, eps_low: float = 0.2,
                   eps_high: float = 0.2) -> dict[str, Tensor]:
    """Share of tokens where the clip is active, low and high separately.

    ratio, advantages, mask: [N, T]. A token is clipped low when r < 1 - eps_low with A < 0 and
    clipped high when r > 1 + eps_high with A > 0: exactly the tokens whose gradient the clip removes.
    Returns {"clip_fraction_low", "clip_fraction_high", "clip_fraction"} as 0-d tensors.
    """
    low = ((ratio < 1.0 - eps_low) & (advantages < 0)).to(ratio.dtype)  # [N, T]
    high = ((ratio > 1.0 + eps_high) & (advantages > 0)).to(ratio.dtype)  # [N, T]
    return {
        "clip_fraction_low": masked_mean(low, mask),
        "clip_fraction_high": masked_mean(high, mask),
        "clip_fraction": masked_mean(low + high, mask),
    }


def zero_variance_share(rewards: Tensor) -> Tensor:
    """Share of groups whose G rewards are all equal (they carry no group-relative signal).

    rewards: [B, G] -> 0-d tensor.
    """
    constant = rewards.amax(dim=1) == rewards.amin(dim=1)  # [B]
    return constant.to(torch.float32).mean()


def advantage_group_variance(advantages: Tensor) -> Tensor:
    """Mean over groups of the (population) variance of advantages inside a group. [B, G] -> []."""
    return advantages.var(dim=1, correction=0).mean()


def reward_stats(rewards: Tensor) -> dict[str, Tensor]:
    """Mean and population std of all rewards, and the mean within-group std. [B, G] -> 0-d tensors."""
    return {
        "reward_mean": rewards.mean(),
        "reward_std": rewards.std(correction=0),
        "reward_group_std": rewards.std(dim=1, correction=0).mean(),
    }


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """1 - Var[returns - values] / Var[returns] over masked tokens: 1 is a perfect critic, 0 no better
    than a constant, negative worse. values, returns, mask: [N, T] -> []."""
    _, resid_var = masked_moments(returns - values, mask)  # []
    _, ret_var = masked_moments(returns, mask)  # []
    return 1 - resid_var / ret_var.clamp(min=1e-12)
