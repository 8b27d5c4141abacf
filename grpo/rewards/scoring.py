"""Scoring a batch of completions with a weighted list of rewards; failures are counted, not fatal.

Dimension letters: N completions, K reward functions.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import torch

from grpo.rewards.builtin import RewardFn

log = logging.getLogger("grpo.rewards")


@dataclass
class RewardResult:
    """Rewards of N completions.

    total: [N] weighted sum, NaN where any reward failed (those completions are left out of the loss).
    per_reward: name -> [N] raw values (NaN on failure). failures: name -> count. first_errors: name ->
    the first exception of each reward that failed in this call, as "Type: message".
    """

    total: torch.Tensor
    per_reward: dict[str, torch.Tensor]
    failures: dict[str, int]
    messages: list[str] = field(default_factory=list)
    first_errors: dict[str, str] = field(default_factory=dict)

    @property
    def failed(self) -> torch.Tensor:  # [N] bool
        return torch.isnan(self.total)


def _check_value(value) -> float:
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, (int, float)):
        raise TypeError(f"returned {type(value).__name__} {value!r:.80}, not a number")
    if not math.isfinite(value):
        raise ValueError(f"returned non-finite {value!r}")
    return float(value)


def _batched_outputs(fn, completions: list[str], samples: list[dict]) -> list:
    """A batched reward (``fn.batched``: all completions in one call, e.g. a reward model): its N
    values, or the exception it raised once per completion."""
    try:
        outs = list(fn(completions, samples))
        if len(outs) != len(completions):
            raise ValueError(f"returned {len(outs)} values for {len(completions)} completions")
        return outs
    except Exception as e:
        return [e] * len(completions)


def score_completions(completions: list[str], samples: list[dict], fns: dict[str, RewardFn],
                      weights: list[float] | None = None, *, logged: set | None = None) -> RewardResult:
    """Run every reward on every (completion, sample) (a batched reward once on all). A reward that raises or returns None, NaN,
    inf or a non-number gives NaN for that sample; the first failure of each kind is logged with
    its sample (``logged`` remembers which kinds were already reported across calls)."""
    if len(completions) != len(samples):
        raise ValueError(f"score_completions: {len(completions)} completions but {len(samples)} samples")
    weights = weights or [1.0] * len(fns)
    logged = set() if logged is None else logged
    n = len(completions)
    per_reward, failures, messages, first_errors = {}, {}, [], {}
    for name in fns:
        vals = torch.full((n,), float("nan"), dtype=torch.float64)  # [N]
        failures[name] = 0
        batch = _batched_outputs(fns[name], completions, samples) if getattr(fns[name], "batched", False) else None
        for i, (comp, sample) in enumerate(zip(completions, samples)):
            try:
                out = fns[name](comp, sample) if batch is None else batch[i]
                if isinstance(out, BaseException):
                    raise out
                if out is None:
                    raise ValueError("returned None (the grader could not decide)")
                vals[i] = _check_value(out)
            except Exception as e:  # a reward is user code: any failure is one sample's, not the run's
                failures[name] += 1
                first_errors.setdefault(name, " ".join(f"{type(e).__name__}: {e}".split())[:300])  # one line
                kind = (name, type(e).__name__)
                if kind not in logged:
                    logged.add(kind)
                    msg = (f"reward {name!r} failed ({type(e).__name__}: {e}) on completion {comp[:200]!r} "
                           f"with answer {sample.get('answer')!r}; such failures are counted in "
                           f"metrics as reward_failures and the samples left out of the loss")
                    log.warning(msg)
                    messages.append(msg)
        per_reward[name] = vals
    stacked = torch.stack([per_reward[k] * w for k, w in zip(fns, weights)])  # [K, N]
    total = stacked.sum(0)  # [N]: NaN propagates, so any failed component fails the sample
    return RewardResult(total=total, per_reward=per_reward, failures=failures, messages=messages,
                        first_errors=first_errors)
