"""A single-turn verifiers (0.4, v1 API) environment on local data, written as a user writes one: the
taskset is the dataset, the task's @vf.reward methods its rubric. Loaded by id "grpo-vf-sum"."""

from __future__ import annotations

import re

import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(self.data.answer in (trace.last_reply or ""))

    @vf.reward(weight=0.5)
    async def has_digit(self, trace: vf.Trace) -> float:
        return float(bool(re.search(r"\d", trace.last_reply or "")))


class SumTaskset(vf.Taskset[SumTask, vf.TasksetConfig]):
    def load(self):
        for a in range(1, 7):
            for b in range(1, 4):
                yield SumTask(SumData(prompt=[{"role": "user", "content": f"What is {a} + {b}?"}], answer=str(a + b)),
                              self.config.task)


__all__ = ["SumTaskset"]
