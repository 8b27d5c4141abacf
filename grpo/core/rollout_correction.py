"""Train/inference mismatch: the sampling engine's log-probs against the trainer's on the same tokens.

An engine such as vLLM samples with its own kernels (and precision), so the policy that drew a token,
pi_engine, is not exactly the policy being trained, pi_train, even with identical weights. The
surrogate's ratio is taken against pi_train's own log-probs of the rollout (its "old" policy); the
importance weight w = pi_train / pi_engine corrects for the rollout having been drawn from pi_engine
(truncated importance sampling, Yao et al. 2025, "Your efficient RL framework secretly brings you
off-policy RL training"). The weight is either truncated at an upper bound (TIS) or, outside a
band [low, high], the token / sequence is masked out of the gradient (MIS; IcePop masks at token
level). ``level``: "token" (one weight per token), "sequence" (the product of the sequence's token
ratios: exp of the summed log ratio, as TRL's ``sequence_*`` modes) or "geometric" (the geometric
mean: exp of the mean log ratio, length-independent, as verl's geometric rejection).

The weight multiplies the policy-gradient term of each token, the KL term untouched (TRL: the
per-token surrogate loss times ``importance_sampling_ratio``). Because w >= 0, multiplying the
advantage by w is exactly that: -min(r A, clip(r) A) * w = -min(r (w A), clip(r) (w A)).

Dimension letters: N sequences, T completion tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

CORRECTION_LEVELS = ("token", "sequence", "geometric")
CORRECTION_MODES = ("truncate", "mask")


@dataclass(frozen=True)
class Correction:
    """Importance weights [N, T] (0 off the mask and where masked) and their metrics (0-d tensors)."""

    weights: Tensor  # [N, T]
    metrics: dict[str, Tensor]


def mismatch_kl(train_logp: Tensor, engine_logp: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """Token-mean estimates of KL(pi_engine || pi_train) from tokens drawn by the engine (Schulman
    2020, "Approximating KL divergence"): with log r = log pi_train - log pi_engine per token,
    k1 = -log r (unbiased, can be negative) and k3 = r - 1 - log r (unbiased, never negative).
    train_logp, engine_logp, mask: [N, T] -> {"mismatch_kl_k1", "mismatch_kl_k3"}."""
    m = mask.to(train_logp.dtype)  # [N, T]
    log_r = (train_logp - engine_logp) * m  # [N, T]
    count = m.sum().clamp(min=1.0)
    k1 = (-log_r * m).sum() / count
    k3 = ((torch.exp(log_r) - 1.0 - log_r) * m).sum() / count
    return {"mismatch_kl_k1": k1, "mismatch_kl_k3": k3}


def correction_weights(train_logp: Tensor, engine_logp: Tensor, mask: Tensor, *, level: str = "sequence",
                       mode: str = "mask", low: float | None = None, high: float | None = 3.0) -> Correction:
    """Importance weights pi_train / pi_engine of an engine's rollout.

    train_logp, engine_logp, mask: [N, T]. ``level`` (CORRECTION_LEVELS) sets what one weight covers;
    ``mode`` "truncate" clamps the weight into [low, high] (TIS; None: unbounded on that side),
    "mask" sets it to 0 where it lies outside [low, high] (MIS / IcePop). Returns the weights,
    broadcast to tokens and 0 off the mask, and metrics: the weight's mean / min / max over the
    masked-in units (tokens, or sequences with a token), the share of those units masked, and the
    mismatch KL (k1, k3). A row without tokens weighs nothing and counts in no metric.
    """
    if level not in CORRECTION_LEVELS:
        raise ValueError(f"rollout correction level: unknown {level!r}; valid: {', '.join(CORRECTION_LEVELS)}")
    if mode not in CORRECTION_MODES:
        raise ValueError(f"rollout correction mode: unknown {mode!r}; valid: {', '.join(CORRECTION_MODES)}")
    if low is not None and high is not None and low > high:
        raise ValueError(f"rollout correction: low {low} > high {high}")
    m = mask.to(train_logp.dtype)  # [N, T]
    train_logp, engine_logp = train_logp.detach(), engine_logp.detach()
    log_r = torch.nan_to_num((train_logp - engine_logp) * m, nan=0.0)  # [N, T]; a NaN log-prob: no correction
    if level == "token":
        unit_log_r, unit_in = log_r, m > 0  # [N, T] each
    else:
        n_tok = m.sum(1, keepdim=True)  # [N, 1]
        unit_log_r = log_r.sum(1, keepdim=True)  # [N, 1]
        if level == "geometric":
            unit_log_r = unit_log_r / n_tok.clamp(min=1.0)
        unit_in = n_tok > 0  # [N, 1]
    ratio = torch.exp(unit_log_r.clamp(max=80.0))  # [N, T] or [N, 1]; clamped so that no weight is inf
    lo = -torch.inf if low is None else low
    hi = torch.inf if high is None else high
    outside = (ratio < lo) | (ratio > hi)  # [N, T] or [N, 1]
    if mode == "mask":
        weight = torch.where(outside, 0.0, ratio)
    else:
        weight = ratio.clamp(min=low, max=high) if (low, high) != (None, None) else ratio
    weights = weight.expand_as(m) * m  # [N, T]
    vals = weight[unit_in]  # [units] the weight as applied
    has = vals.numel() > 0
    share = (outside & unit_in).sum() / unit_in.sum().clamp(min=1)
    zero = train_logp.new_zeros(())
    metrics = {"rollout_is_weight_mean": vals.mean() if has else zero,
               "rollout_is_weight_min": vals.min() if has else zero,
               "rollout_is_weight_max": vals.max() if has else zero,
               # the share of units (tokens or sequences) masked out (mask) or clamped (truncate)
               "rollout_is_masked_share": share if mode == "mask" else zero,
               "rollout_is_clipped_share": share if mode == "truncate" else zero,
               **mismatch_kl(train_logp, engine_logp, mask)}
    return Correction(weights, metrics)
