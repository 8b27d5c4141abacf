"""A TRL-form two-task setup for the mixture tests: two environment classes (routed by the dataset's
`task` column) and one reward function per task that returns None on the other task's rows."""

from __future__ import annotations


class AdderEnv:
    """The arithmetic rows' environment."""

    def reset(self, **kwargs) -> str | None:
        self.task = kwargs["task"]
        return None

    def add(self, a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: the first integer
            b: the second integer
        """
        return str(a + b)


class MultiplierEnv:
    """The calculator rows' environment."""

    def reset(self, **kwargs) -> str | None:
        self.task = kwargs["task"]
        return None

    def multiply(self, a: int, b: int) -> str:
        """Multiply two integers.

        Args:
            a: the first integer
            b: the second integer
        """
        return str(a * b)


def _digit_share(text) -> float:
    text = text if isinstance(text, str) else str(text[-1]["content"])  # an episode: its final answer
    return sum(c.isdigit() for c in text) / max(len(text), 1)


def arithmetic_reward(completions, task, environments, **kwargs):
    """Digit share on the arithmetic rows (their environment must be an AdderEnv), None elsewhere."""
    out = []
    for completion, kind, env in zip(completions, task, environments):
        if kind != "arithmetic":
            out.append(None)
            continue
        if not isinstance(env, AdderEnv) or env.task != kind:
            raise AssertionError(f"an arithmetic row ran in {type(env).__name__}")
        out.append(_digit_share(completion))
    return out


def calculator_reward(completions, task, environments, **kwargs):
    """Digit share on the calculator rows (their environment must be a MultiplierEnv), None elsewhere."""
    out = []
    for completion, kind, env in zip(completions, task, environments):
        if kind != "calculator":
            out.append(None)
            continue
        if not isinstance(env, MultiplierEnv) or env.task != kind:
            raise AssertionError(f"a calculator row ran in {type(env).__name__}")
        out.append(_digit_share(completion))
    return out


def rows(n: int = 16) -> list[dict]:
    """n rows of each task, the task in the `task` column."""
    add = [{"prompt": f"What is {a} + {a + 1}?", "answer": str(2 * a + 1), "task": "arithmetic"} for a in range(1, n + 1)]
    mul = [{"prompt": f"What is {a} * 3?", "answer": str(3 * a), "task": "calculator"} for a in range(1, n + 1)]
    return add + mul
