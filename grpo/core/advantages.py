"""Advantage estimators: rewards of a batch of groups -> advantages.

Dimension letters: B prompts, G completions per prompt (group size), N = B*G sequences,
T completion tokens, S reasoning steps per completion.

Every entry of ``ESTIMATORS`` is an ``Estimator``. An outcome estimator (the group-relative ones and
their baselines) has the one signature::

    estimator(rewards  # [B, G]
              , *, std_eps: float = 1e-6, unbiased_std: bool = True) -> advantages  # [B, G]

so the trainer picks one by name and never special-cases it; outcome supervision broadcasts the
[B, G] advantage to every completion token, process supervision uses ``process_advantages``. The
one entry that declares ``critic`` (``gae``, PPO's baseline) is token-level: ``gae`` on per-token
rewards and a learned value model's values, which a run with it builds (the declaration, not the
name, tells the config and the trainer so).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from grpo.core.losses import masked_moments
from grpo.registry import Registry



@dataclass(frozen=True)
class Estimator:
    """An advantage estimator: ``fn`` and what it declares. ``group``: it compares completions within a
    group, so it needs G >= 2 to carry any signal; ``critic``: it is token-level on a learned value
    model's values (``fn(rewards_tok, values, mask, *, gamma, lam)``), not an outcome estimator."""

    fn: Callable[..., Tensor]
    group: bool = False
    critic: bool = False
    doc: str = ""

    def __call__(self, *args, **kwargs):
        """``fn``'s result: an outcome estimator maps rewards [B, G] to advantages [B, G]."""
        return self.fn(*args, **kwargs)


def _check_group(rewards: Tensor, name: str, min_group: int = 1) -> None:
    """Raise unless rewards is [B, G] with G >= min_group (a shape check, no data inspected)."""
    if rewards.dim() != 2:
        raise ValueError(f"{name}: rewards must have shape [B, G], got {tuple(rewards.shape)}")
    if rewards.shape[1] < min_group:
        raise ValueError(f"{name}: needs a group size G >= {min_group}, got G = {rewards.shape[1]}")


def _group_centered(rewards: Tensor) -> Tensor:
    """r - group mean, exactly 0 in a group whose rewards are all equal. [B, G] -> [B, G].

    Floating-point mean of equal values can differ from them in the last bit; forcing exact zeros
    keeps zero-variance groups out of the gradient instead of amplifying rounding noise by 1/eps.
    """
    mean = rewards.mean(dim=1, keepdim=True)  # [B, 1]
    constant = (rewards.amax(dim=1, keepdim=True) == rewards.amin(dim=1, keepdim=True))  # [B, 1]
    return torch.where(constant, torch.zeros_like(rewards), rewards - mean)  # [B, G]


def grpo_advantages(rewards: Tensor, *, std_eps: float = 1e-6, unbiased_std: bool = True) -> Tensor:
    """Group z-score (DeepSeekMath eq. 3 with outcome supervision): (r - mean) / (std + eps).

    rewards: [B, G] -> advantages [B, G]. ``unbiased_std`` selects Bessel's correction (G - 1).
    """
    _check_group(rewards, "grpo", min_group=2 if unbiased_std else 1)
    centered = _group_centered(rewards)  # [B, G]
    std = rewards.std(dim=1, keepdim=True, correction=1 if unbiased_std else 0)  # [B, 1]
    return centered / (std + std_eps)  # [B, G]


def dr_grpo_advantages(rewards: Tensor, *, std_eps: float = 1e-6, unbiased_std: bool = True) -> Tensor:
    """Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): r - group mean, no std.

    rewards: [B, G] -> advantages [B, G]. Dividing by std up-weights easy and hard prompts; Dr.GRPO
    drops it. ``std_eps`` and ``unbiased_std`` are accepted for the common signature and unused.
    """
    _check_group(rewards, "dr_grpo")
    return _group_centered(rewards)  # [B, G]


def rloo_advantages(rewards: Tensor, *, std_eps: float = 1e-6, unbiased_std: bool = True) -> Tensor:
    """RLOO (Ahmadian et al. 2024): r_i - mean of the other G - 1 rewards of the group.

    rewards: [B, G] -> advantages [B, G]. Equals G / (G - 1) * (r_i - group mean).
    """
    _check_group(rewards, "rloo", min_group=2)
    g = rewards.shape[1]
    # mean of the others = (G * mean - r_i) / (G - 1), so r_i - that = G / (G - 1) * (r_i - mean).
    return _group_centered(rewards) * (g / (g - 1))  # [B, G]


def reinforce_advantages(rewards: Tensor, *, std_eps: float = 1e-6, unbiased_std: bool = True) -> Tensor:
    """REINFORCE without a baseline (Williams 1992): A = r. rewards: [B, G] -> [B, G]."""
    _check_group(rewards, "reinforce")
    return rewards.clone()  # [B, G]


def mean_baseline_advantages(rewards: Tensor, *, std_eps: float = 1e-6, unbiased_std: bool = True) -> Tensor:
    """REINFORCE with a batch-mean baseline: r - mean over all B*G rewards. [B, G] -> [B, G]."""
    _check_group(rewards, "mean_baseline")
    return rewards - rewards.mean()  # [B, G]


def batch_std_advantages(rewards: Tensor, *, std_eps: float = 1e-6, unbiased_std: bool = True) -> Tensor:
    """Group mean, batch std (Liu et al. 2025, "Tricks or Traps?", Lite PPO): (r - group mean) /
    (std of all B*G rewards + eps). [B, G] -> [B, G].

    A batch-level scale is robust to groups whose rewards are nearly constant.
    """
    _check_group(rewards, "batch_std")
    n = rewards.numel()
    correction = 1 if (unbiased_std and n > 1) else 0
    std = rewards.std(correction=correction)  # []
    return _group_centered(rewards) / (std + std_eps)  # [B, G]


ESTIMATORS: Registry[Estimator] = Registry("advantage estimator", field="advantage_estimator")
ESTIMATORS.register("grpo", Estimator(grpo_advantages, group=True))
ESTIMATORS.register("dr_grpo", Estimator(dr_grpo_advantages, group=True))
ESTIMATORS.register("rloo", Estimator(rloo_advantages, group=True))
ESTIMATORS.register("reinforce", Estimator(reinforce_advantages))
ESTIMATORS.register("mean_baseline", Estimator(mean_baseline_advantages))
ESTIMATORS.register("batch_std", Estimator(batch_std_advantages, group=True))


def get_estimator(name: str) -> Estimator:
    """Look an outcome estimator up by name; an unknown name lists the valid ones, a token-level one
    (``critic``) is refused. It maps rewards [B, G] to advantages [B, G] (see the module docstring)."""
    estimator = ESTIMATORS[name]
    if estimator.critic:
        raise ValueError(f"advantage estimator {name!r} is token-level on a critic's values, not rewards [B, G]")
    return estimator


def compute_advantages(rewards: Tensor, *, estimator: str = "grpo", std_eps: float = 1e-6,
                       unbiased_std: bool = True) -> Tensor:
    """Dispatch to ``ESTIMATORS[estimator]``. rewards: [B, G] -> advantages [B, G]."""
    return get_estimator(estimator)(rewards, std_eps=std_eps, unbiased_std=unbiased_std)


# How several reward functions become one advantage.
MULTI_OBJECTIVE_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")


def gdpo_advantages(per_reward: Tensor, weights: Tensor, *, std_eps: float = 1e-6,
                    unbiased_std: bool = True) -> Tensor:
    """GDPO (Group reward-Decoupled normalization Policy Optimization, arXiv 2601.05242): normalise
    each reward function's scores within the group, sum them with the weights, then scale the sum
    by its std over the batch (TRL's multi_objective_aggregation = "normalize_then_sum").

    per_reward: [B, G, K] the K reward functions' raw scores; weights: [K] -> advantages [B, G]:
      A = S / (std(S) + eps),  S_bg = sum_k w_k (r_bgk - mean_g r_bgk) / (std_g r_bgk + eps).
    A reward that is constant within a group adds exactly 0 there (as in grpo_advantages), whatever
    the other rewards do, so it never drowns their signal as a raw weighted sum can. Each group's S
    sums to 0 over its G completions, so the batch mean of S is 0 and only the scale is applied
    (TRL also subtracts the batch mean, which equals 0 up to rounding): a group whose rewards are
    all constant keeps advantages of exactly 0. ``unbiased_std``: Bessel's correction in both stds.
    """
    if per_reward.dim() != 3 or weights.shape != per_reward.shape[2:]:
        raise ValueError(f"gdpo: per_reward must be [B, G, K] and weights [K], got {tuple(per_reward.shape)} "
                         f"and {tuple(weights.shape)}")
    k = per_reward.shape[2]
    normed = torch.stack([grpo_advantages(per_reward[..., j], std_eps=std_eps, unbiased_std=unbiased_std)
                          for j in range(k)], dim=-1)  # [B, G, K]
    summed = (normed * weights.to(normed.dtype)).sum(-1)  # [B, G]
    correction = 1 if (unbiased_std and summed.numel() > 1) else 0
    return summed / (summed.std(correction=correction) + std_eps)  # [B, G]


def process_advantages(step_rewards: Tensor, step_end_index: Tensor, mask: Tensor, *, group_size: int,
                       std_eps: float = 1e-6, unbiased_std: bool = True) -> Tensor:
    """Process supervision (DeepSeekMath section 4.1.3).

    step_rewards:   [N, S] reward of each reasoning step (entries with step_end_index < 0 are padding)
    step_end_index: [N, S] completion-token index at which each step ends; -1 marks "no such step"
    mask:           [N, T] 1 on completion tokens that count
    returns:        [N, T] advantage of each token

    Each step reward is normalized by the mean and std of all step rewards of its group
    (the G completions of one prompt), and a token's advantage is the sum of the normalized rewards
    of the steps that end at or after it: A_{i,t} = sum_{index(j) >= t} r~_i^{index(j)}.
    """
    n, s = step_rewards.shape
    t = mask.shape[1]
    if n % group_size:
        raise ValueError(f"process_advantages: N = {n} is not a multiple of group_size = {group_size}")
    valid = (step_end_index >= 0).to(step_rewards.dtype)  # [N, S]
    grouped_r = (step_rewards * valid).reshape(n // group_size, group_size * s)  # [B, G*S]
    grouped_v = valid.reshape(n // group_size, group_size * s)  # [B, G*S]
    count = grouped_v.sum(dim=1, keepdim=True)  # [B, 1]
    mean = grouped_r.sum(dim=1, keepdim=True) / count.clamp(min=1)  # [B, 1]
    sq = (((grouped_r - mean) * grouped_v) ** 2).sum(dim=1, keepdim=True)  # [B, 1]
    denom = (count - 1).clamp(min=1) if unbiased_std else count.clamp(min=1)  # [B, 1]
    std = (sq / denom).sqrt()  # [B, 1]
    normed = ((grouped_r - mean) / (std + std_eps) * grouped_v).reshape(n, s)  # [N, S]
    # Scatter each step's normalized reward onto the token where it ends, then a reverse cumulative
    # sum gives, at token t, the sum over steps ending at or after t.
    end = step_end_index.clamp(min=0, max=t - 1)  # [N, S]
    at_end = torch.zeros(n, t, dtype=step_rewards.dtype, device=step_rewards.device)  # [N, T]
    at_end.scatter_add_(1, end, normed)  # [N, T]
    adv = at_end.flip(1).cumsum(1).flip(1)  # [N, T]
    return adv * mask.to(adv.dtype)  # [N, T]


def gae(rewards_tok: Tensor, values: Tensor, mask: Tensor, *, gamma: float = 1.0,
        lam: float = 0.95) -> dict[str, Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016) for the PPO-with-critic baseline.

    rewards_tok: [N, T] per-token rewards; values: [N, T] critic values; mask: [N, T].
    Returns {"advantages": [N, T], "returns": [N, T]} (returns = advantages + values).
    Masked tokens are skipped: the recursion carries the next valid token's value and advantage
    through them, so a mask with holes (e.g. tool output) is handled, and trailing padding ends
    the episode (its next value is 0).
    """
    n, t = rewards_tok.shape
    m = mask.to(values.dtype)  # [N, T]
    next_value = torch.zeros(n, dtype=values.dtype, device=values.device)  # [N]
    last_adv = torch.zeros(n, dtype=values.dtype, device=values.device)  # [N]
    adv = torch.zeros_like(values)  # [N, T]
    for i in range(t - 1, -1, -1):
        delta = rewards_tok[:, i] + gamma * next_value - values[:, i]  # [N]
        cur = delta + gamma * lam * last_adv  # [N]
        last_adv = m[:, i] * cur + (1 - m[:, i]) * last_adv  # [N]
        next_value = m[:, i] * values[:, i] + (1 - m[:, i]) * next_value  # [N]
        adv[:, i] = last_adv
    adv = adv * m  # [N, T]
    return {"advantages": adv, "returns": (adv + values) * m}


ESTIMATORS.register("gae", Estimator(gae, critic=True, doc="PPO's baseline (DeepSeekMath eq. 2): generalized advantage "
                                     "estimation on a learned critic's values, the KL to the reference in the per-token "
                                     "reward, advantages whitened (Schulman et al. 2016)."))


def whiten(x: Tensor, mask: Tensor, *, eps: float = 1e-8, mean: Tensor | None = None,
           var: Tensor | None = None) -> Tensor:
    """Normalize x to zero mean and unit variance over the tokens where mask is 1. [N, T] -> [N, T].
    ``mean`` and ``var`` ([]) replace the statistics of x's own tokens (those of a batch split over
    processes, from ``masked_moments`` with a reduce over them)."""
    if mean is None or var is None:
        mean, var = masked_moments(x, mask)  # [], []
    out = (x - mean) * torch.rsqrt(var + eps)  # [N, T]
    return out * mask.to(x.dtype)  # [N, T]


def kl_shaped_rewards(scores: Tensor, logp: Tensor, ref_logp: Tensor | None, mask: Tensor, *,
                      kl_coef: float) -> Tensor:
    """Per-token rewards of PPO with a KL penalty in the reward (DeepSeekMath equation (2)).

    scores: [N] outcome reward of each completion; logp, ref_logp, mask: [N, T].
    r_t = -kl_coef * (log pi_old(o_t) - log pi_ref(o_t)) on every completion token, plus the outcome
    score on the last one (the last token of the mask, which may have holes). Returns [N, T].
    """
    m = mask.to(logp.dtype)  # [N, T]
    rewards = torch.zeros_like(logp)  # [N, T]
    if ref_logp is not None and kl_coef:
        rewards = -kl_coef * (logp - ref_logp) * m  # [N, T]
    cols = torch.arange(m.shape[1], device=m.device)  # [T]
    last = torch.where(m > 0, cols, 0).amax(1) if m.shape[1] else cols.new_zeros(m.shape[0])  # [N] last masked token
    has_tokens = (m.sum(1) > 0).to(logp.dtype)  # [N]
    return rewards.scatter_add(1, last[:, None], (scores.to(logp.dtype) * has_tokens)[:, None])  # [N, T]
