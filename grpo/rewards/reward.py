"""What a reward is: a ``Reward`` object that declares its form and capabilities, which everything
that runs rewards reads (the scoring, the reward runner, resampling, the serving scheme); nothing
looks for attributes on a function.

Built-in rewards are declared as ``Reward`` entries of ``grpo.rewards.builtin.REWARDS``. A user's
callable (``module:function``, or handed to the Python API) becomes a ``Reward`` once, when it is
resolved (``Reward.of``): its form told by its signature (TRL's per-batch form takes a parameter
named ``completions``: grpo.rewards.forms), nothing else declared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from grpo.rewards.forms import is_batch_reward
from grpo.rewards.judge import JudgeSettings
from grpo.rewards.remote import DEFAULT_CONCURRENCY


@dataclass(frozen=True)
class RewardOptions:
    """How a run's rewards are resolved and run, from the run's config to the reward runner (its fields
    of the same names, ``reward_`` prefixed; the judge's, its ``judge_*`` fields): the deadline, retries
    and concurrency of the rewards that keep their own deadline (``async def`` functions, URLs, the
    judge) and of the worker processes (``workers``; timeout 0: in this process, no deadline), the
    ``reward_model`` reward's model and score transform, the ``judge`` reward's endpoint, template and
    score parser. Each default is its Config field's (tests/test_settings_sources.py holds them equal)."""

    timeout: float = 10.0  # reward_timeout (0: in this process, none)
    retries: int = 2  # reward_retries
    concurrency: int = DEFAULT_CONCURRENCY  # reward_concurrency
    workers: int = 1  # reward_workers
    reward_model: str = ""  # reward_model: a folder or hub id
    reward_model_transform: str = "none"  # reward_model_transform
    judge: JudgeSettings = JudgeSettings()  # the judge_* fields


@dataclass(frozen=True)
class Reward:
    """A reward function and what it declares about itself.

    name: the name it is configured and logged under.
    fn: the function, in the form ``batch`` says (grpo.rewards.forms): ``fn(completion, sample)``, or
      TRL's ``fn(completions=..., ...)`` once per batch.
    batch: TRL's per-batch form.
    valid: ``(completion, sample) -> bool``, the completions it can grade (``resample_invalid_rounds``
      samples the others again); None: every completion.
    startup_check: ``() -> None`` that raises when it cannot grade on this machine; run when the reward
      is resolved, so a run that cannot grade stops before its model loads. None: nothing to check.
    own_deadline: it enforces its deadline itself (its own worker processes, event loop or HTTP
      deadline), so it runs in the trainer's process, never in a reward worker.
    reads_final_answer: it reads a final answer out of the text (``grpo serve`` then checks that an
      answer states one).
    build: for a reward with settings of its own (the reward model's path and transform, the judge's endpoint),
      ``(RewardOptions) -> fn``, called once when the reward is resolved; ``fn`` is then a stand-in
      that says what is missing.
    doc: what it computes ('': the function's docstring).
    """

    name: str
    fn: Callable
    batch: bool = False
    valid: Callable[[str, dict], bool] | None = None
    startup_check: Callable[[], None] | None = None
    own_deadline: bool = False
    reads_final_answer: bool = False
    build: Callable[[RewardOptions], Callable] | None = None
    doc: str = ""

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    @classmethod
    def of(cls, name: str, fn: Callable) -> Reward:
        """``fn`` when it already is a Reward, else a user's callable as one: its form told by its
        signature, nothing else declared."""
        if isinstance(fn, Reward):
            return fn
        return cls(name=name, fn=fn, batch=is_batch_reward(fn))
