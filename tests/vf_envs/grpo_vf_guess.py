"""A multi-turn verifiers (0.4, v1 API) environment: the environment's own run() answers each guess until it
is right or the rounds run out; rewarded for solving, less per turn. Loaded by id "grpo-vf-guess"."""

from __future__ import annotations

import re

import verifiers.v1 as vf

SYSTEM = "Guess my secret digit from 0 to 9. Reply with one digit."


def _guess(text: str | None) -> int | None:
    m = re.search(r"\d", text or "")
    return int(m.group(0)) if m else None


class GuessData(vf.TaskData):
    secret: int


class GuessTask(vf.Task[GuessData]):
    @vf.reward(weight=1.0)
    async def solved(self, trace: vf.Trace) -> float:
        return float(any(_guess(m.content) == self.data.secret for m in trace.assistant_messages))

    @vf.reward(weight=-0.1)
    async def turns(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)


class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    def load(self):
        for secret in (3, 7, 1, 9, 5, 0, 8, 2, 6, 4, 3, 7):
            yield GuessTask(GuessData(system_prompt=SYSTEM, prompt="Start.", secret=secret), self.config.task)


class GuessConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig(max_turns=3)
    max_rounds: int = 3


class GuessEnv(vf.Env[GuessConfig]):
    async def run(self, task: GuessTask, agents: vf.Agents) -> None:
        async with agents.agent.interaction(task) as it:
            seg = await it.turn()
            for _ in range(self.config.max_rounds):
                if seg.terminated:
                    break
                guess = _guess(seg.last_reply)
                if guess == task.data.secret:
                    break
                hint = "Reply with one digit." if guess is None else \
                    f"{guess} is too {'low' if guess < task.data.secret else 'high'}."
                seg = await it.turn(hint)


__all__ = ["GuessTaskset", "GuessEnv"]
