"""Staleness of asynchronous rollouts: which policy version drew each token, and how far behind the
trainer that is.

In asynchronous GRPO the sampler keeps drawing while the trainer updates, so a sample can be drawn by
weights some optimizer steps older than the ones being trained (and, with partial rollouts, one row
by several versions: weights that change while it decodes). A sample's staleness is the trainer's
step minus the oldest policy version among its tokens (verl's staleness threshold, NeMo-RL's
``max_trajectory_age_steps``); samples over the bound are not trained. Tokens drawn by an older
version are corrected by the importance weight pi_train / pi_version (truncated or masked:
``rollout_correction.correction_weights``; Yao et al. 2025), the tokens drawn by the trained
weights themselves are left as they are, so a bound of 0 is the synchronous objective exactly.

Dimension letters: N sequences, T completion tokens, S samples (groups).
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpo.core.rollout_correction import Correction, correction_weights

NO_TOKENS = torch.iinfo(torch.int64).max  # the oldest version of a row without tokens: never stale


def oldest_version(versions: Tensor, mask: Tensor) -> Tensor:
    """The oldest policy version among each row's tokens. versions, mask: [N, T] -> [N] (NO_TOKENS
    for a row without tokens)."""
    if versions.shape[1] == 0:
        return torch.full(versions.shape[:1], NO_TOKENS, dtype=torch.int64, device=versions.device)  # [N]
    big = torch.full_like(versions, NO_TOKENS)  # [N, T]
    return torch.where(mask.bool(), versions, big).amin(1)  # [N]


def sample_staleness(versions: Tensor, mask: Tensor, *, step: int, group_size: int) -> Tensor:
    """Each sample's (group of ``group_size`` rows) staleness: ``step`` minus the oldest version of
    any of its tokens, never below 0 (a group without tokens is 0). versions, mask: [N, T] -> [S]."""
    oldest = oldest_version(versions, mask).view(-1, group_size).amin(1)  # [S]
    stale = step - oldest.clamp(max=step)  # [S]
    return stale.clamp(min=0)


def stale_tokens(versions: Tensor, mask: Tensor, *, step: int) -> Tensor:
    """Tokens drawn by an older version than ``step``'s weights. versions, mask: [N, T] -> bool [N, T]."""
    return mask.bool() & (versions < step)


def staleness_histogram(staleness: Tensor, *, max_staleness: int) -> Tensor:
    """Counts of samples at staleness 0, 1, ..., max_staleness and, last, above it. staleness: [S] ->
    [max_staleness + 2] int64."""
    clipped = staleness.clamp(max=max_staleness + 1)  # [S]
    return torch.bincount(clipped, minlength=max_staleness + 2)


def stale_correction(train_logp: Tensor, engine_logp: Tensor, mask: Tensor, stale: Tensor, *, level: str,
                     mode: str, low: float | None, high: float | None) -> Correction:
    """Importance weights pi_train / pi_engine of the ``stale`` tokens only (their engine log-probs are
    the log-probs of the version that drew them). ``level`` token: each stale token its own weight;
    sequence / geometric: the weight of a row's stale tokens covers the whole row (a masked row loses
    all its tokens). Tokens of rows without a stale token weigh 1 exactly; the metrics are those of the
    stale tokens (core.correction_weights).
    train_logp, engine_logp, mask, stale: [N, T] -> weights [N, T] (0 off ``mask``)."""
    m = mask.to(train_logp.dtype)  # [N, T]
    corr = correction_weights(train_logp, engine_logp, stale, level=level, mode=mode, low=low, high=high)
    if level == "token":
        w = torch.where(stale, corr.weights, torch.ones_like(corr.weights))  # [N, T]
    else:
        row_has = stale.any(1, keepdim=True)  # [N, 1]
        row_w = corr.weights.amax(1, keepdim=True)  # [N, 1]: one weight per row, on its stale tokens
        w = torch.where(row_has, row_w, torch.ones_like(row_w)).expand_as(m)  # [N, T]
    return Correction(weights=w * m, metrics=corr.metrics)
