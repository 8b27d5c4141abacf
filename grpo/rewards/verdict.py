"""A completion's verdict: is it correct? The first of the rewards, in their order, that applies to
its row (a number, not None) decides: correct when that value is at least 1. A run whose first
reward applies to every row is judged by its first reward alone; a TRL-form reward set whose
functions return None on the other tasks' rows is judged, row by row, by the reward of its task.

Dimension letters: N completions, K rewards.
"""

from __future__ import annotations

import torch


def first_applicable(per_reward: dict[str, torch.Tensor], names: list[str]) -> torch.Tensor:
    """Each row's value of the first reward in ``names`` that is not NaN there (NaN: it returned None
    or failed), NaN where none is a number. per_reward: name -> [N]; returns [N]."""
    stacked = torch.stack([per_reward[k].double() for k in names])  # [K, N]
    found = ~torch.isnan(stacked)  # [K, N]
    first = found.double().argmax(0)  # [N]: the first applicable reward's index (0 where none)
    out = stacked.gather(0, first[None]).squeeze(0)  # [N]
    return torch.where(found.any(0), out, torch.full_like(out, float("nan")))  # [N]


def correct(values: torch.Tensor) -> torch.Tensor:
    """Verdicts [N] of verdict values [N]: at least 1 (NaN, no verdict, counts as wrong)."""
    return values >= 1.0
