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


# ---- the seeds' monitors and symptoms (seed 002 section 4, seed 003 section 3.4, seed 004) ----------

def group_advantage_std(rewards: Tensor) -> Tensor:
    """Group advantage variance (GAV), seed 003 section 3.4: the standard deviation (population, over
    the K completions) of the group-relative advantages A_i = r_i - mean of the other K - 1 rewards
    (its section 2.1), averaged over groups. Computed on the raw rewards, never on z-scored
    advantages: a z-score's std is fixed by G alone in every group with any spread, so it would say
    nothing but the share of zero-variance groups. Equals K / (K - 1) * std(r) per group.
    rewards: [B, G] with G >= 2 -> []."""
    k = rewards.shape[1]
    others = (rewards.sum(dim=1, keepdim=True) - rewards) / (k - 1)  # [B, G] mean of the other K - 1
    return (rewards - others).std(dim=1, correction=0).mean()


def group_outcome_shares(rewards: Tensor, *, correct_at: float = 1.0) -> dict[str, Tensor]:
    """Shares of groups whose completions are all correct and all wrong (seed 002 section 4: watch
    them with the reward's spread), a completion being correct when its reward is >= ``correct_at``.
    rewards: [B, G] -> {"all_correct_share", "all_wrong_share"} as 0-d tensors."""
    correct = rewards >= correct_at  # [B, G]
    return {"all_correct_share": correct.all(dim=1).to(torch.float32).mean(),
            "all_wrong_share": (~correct).all(dim=1).to(torch.float32).mean()}


def distinct_n(ids: Tensor, mask: Tensor, *, n: int) -> Tensor:
    """Distinct-n (Li et al. 2016) of a set of completions: distinct n-grams / all n-grams, counted
    over every completion together (seed 004: falling output diversity is a symptom of entropy
    collapse). An n-gram lies within one completion's counted tokens (mask 1; holes are closed up).
    ids, mask: [N, T] -> []; 0 when no completion has n tokens."""
    grams = []
    for row, m in zip(ids, mask.bool()):
        toks = row[m]  # [L] this completion's counted tokens
        if toks.numel() >= n:
            grams.append(toks.unfold(0, n, 1))  # [L - n + 1, n]
    if not grams:
        return torch.zeros((), dtype=torch.float32)
    allg = torch.cat(grams)  # [M, n]
    return torch.tensor(torch.unique(allg, dim=0).shape[0] / allg.shape[0], dtype=torch.float32)


def loop_flags(ids: Tensor, mask: Tensor, *, max_period: int = 8, min_repeats: int = 4) -> Tensor:
    """Which completions loop (seed 003 section 1's "所以所以所以", seed 004's repetition): some span of
    p <= ``max_period`` tokens repeats at least ``min_repeats`` times back to back, i.e. x[t] == x[t + p]
    holds for p * (min_repeats - 1) consecutive counted positions. ids, mask: [N, T] -> [N] bool."""
    n, t = ids.shape
    m = mask.bool()  # [N, T]
    looping = torch.zeros(n, dtype=torch.bool, device=ids.device)  # [N]
    pos = torch.arange(t, device=ids.device)  # [T]
    for p in range(1, max_period + 1):
        need = p * (min_repeats - 1)
        if need > t - p:
            break
        same = (ids[:, p:] == ids[:, :-p]) & m[:, p:] & m[:, :-p]  # [N, T - p]
        # length of the run of True ending at each position: index - index of the last False
        last_false = torch.where(same, torch.full_like(pos[: t - p], -1), pos[: t - p]).expand_as(same)
        run = pos[: t - p] - last_false.cummax(dim=1).values  # [N, T - p]
        looping |= (run >= need).any(dim=1)
    return looping
