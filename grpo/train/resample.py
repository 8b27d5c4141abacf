"""Resampling completions a reward cannot compare (seed 003 section 5.1: code that fails ``ast.parse``
is sampled again until the group parses), so a group's advantages compare like with like.

A reward declares which completions it can grade with a ``valid(completion, sample) -> bool``
attribute (the code rewards: the program parses). Rows that fail any reward's check are sampled
again, at most ``rounds`` times, each time from fresh keys; the rows still invalid after the last
round stay as they are (and score as the reward scores them). Nothing here knows what a reward checks.

Dimension letters: n rows of this process, T completion tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from grpo.infra import distributed
from grpo.rollout import Rollout
from grpo.rollout.types import concat_rollouts, select_rollout

RESAMPLE_ROW_BASE = 2**19  # resampled rows draw from keys above every first draw's (row_keys has 2^20 per step)


@dataclass
class Resampled:
    rollout: Rollout
    rounds: int  # sampling rounds spent on invalid rows (agreed across processes)
    resampled: int  # rows sampled again, counted once per round (this process)
    invalid_left: int  # rows still invalid after the last round (this process)


def validity_checks(rewards: dict) -> list[Callable[[str, dict], bool]]:
    """The ``valid`` checks the configured rewards (name -> Reward) declare (none: nothing is resampled)."""
    return [r.valid for r in rewards.values() if r.valid is not None]


def invalid_rows(texts: list[str], samples: list[dict], checks: list) -> list[int]:
    """Rows whose completion fails a check; a check that raises counts as failed."""
    def ok(text, sample):
        try:
            return all(check(text, sample) for check in checks)
        except Exception:
            return False
    return [i for i, (t, s) in enumerate(zip(texts, samples)) if not ok(t, s)]


def resample_invalid(ro: Rollout, row_samples: list[dict], prompts: list[str], *, checks: list, rounds: int,
                     generate: Callable[[list[str], list[int]], Rollout], key_of: Callable[[int, int], int],
                     pad_id: int, world: distributed.World) -> Resampled:
    """Sample the invalid rows of ``ro`` again until every row is valid or ``rounds`` rounds are spent.
    ``row_samples[i]`` / ``prompts[i]``: row i's task row and rendered prompt; ``generate(prompts, keys)``
    samples one completion per prompt; ``key_of(round, row)`` the key of a row's resampling in a round.
    On several processes all of them take part in every round while any has an invalid row (a process
    with none samples its first row and drops it), so collective generation stays in step."""
    if not checks or rounds <= 0:
        return Resampled(ro, 0, 0, 0)
    bad = invalid_rows(ro.texts, row_samples, checks)
    spent = resampled = 0
    while spent < rounds and int(distributed.all_sum(torch.tensor(len(bad)), world)) > 0:
        rows = bad or [0]
        new = generate([prompts[i] for i in rows], [key_of(spent, i) for i in rows])
        spent += 1
        if not bad:
            continue
        resampled += len(bad)
        merged = concat_rollouts([ro, new], pad_id)
        idx = torch.arange(len(ro.texts))  # [n]
        idx[torch.tensor(bad)] = len(ro.texts) + torch.arange(len(bad))
        ro = select_rollout(merged, idx)  # the invalid rows replaced by their new samples, in place
        ro.seconds = merged.seconds
        bad = invalid_rows(ro.texts, row_samples, checks)
    return Resampled(ro, spent, resampled, len(bad))
