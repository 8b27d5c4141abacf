"""Wall-clock seconds per stage of a training step, as verl's stage timers: every metrics line holds
every stage (0.0 where it did not run), so lines of different steps have the same keys.

A stage on an accelerator waits for its queued kernels at the end (``torch.cuda.synchronize``), so the
time of asynchronous work lands in the stage that launched it, not in the next one that blocks.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

# in the order of a step: the rollout, its rewards, the frozen forwards of the batch, the update, the
# engines' weight sync, then what may follow the step (a periodic evaluation, a checkpoint)
STAGES = ("sampling", "rewards", "old_logp", "reference", "update", "sync", "eval", "checkpoint")


def stage_key(name: str) -> str:
    """The metric name of a stage, e.g. time/sampling_seconds."""
    return f"time/{name}_seconds"


class StageTimer:
    """Adds up the seconds spent in each named stage until ``take`` returns and clears them. Nested or
    repeated stages add (dynamic sampling's rounds each sample and score)."""

    def __init__(self, device: torch.device | None = None, stages: tuple[str, ...] = STAGES):
        self.stages = stages
        self.sync = device is not None and device.type == "cuda"
        self.seconds = dict.fromkeys(stages, 0.0)

    def _wait(self) -> None:
        if self.sync:
            torch.cuda.synchronize()

    @contextmanager
    def stage(self, name: str):
        if name not in self.seconds:
            raise KeyError(f"unknown stage {name!r}; stages are {list(self.stages)}")
        self._wait()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._wait()
            self.seconds[name] += time.perf_counter() - start

    def take(self, names: tuple[str, ...] | None = None) -> dict[str, float]:
        """The metrics of ``names`` (default: every stage), each then reset to 0."""
        out = {}
        for name in names or self.stages:
            out[stage_key(name)] = self.seconds[name]
            self.seconds[name] = 0.0
        return out


class NullTimer(StageTimer):
    """Times nothing (a component used outside a trainer)."""

    @contextmanager
    def stage(self, name: str):
        yield
