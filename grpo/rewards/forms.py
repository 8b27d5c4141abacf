"""The two forms of a reward function, told apart by its signature, and how each is called.

- **Per completion** (grpo's form): ``fn(completion: str, sample: dict) -> float | None``, called once
  per completion with its task row (in a tools or environment run, the row with its episode's
  transcript and counts beside it).
- **Per batch** (TRL's form): a function with a parameter named ``completions``, called once per batch
  with keyword lists, as TRL's ``GRPOTrainer`` calls its reward functions: ``prompts`` (each row's
  prompt as the dataset holds it), ``completions`` (the text, or for a conversational prompt, or any
  multi-turn episode, the list of messages the model and its tools wrote), ``completion_ids`` (the
  completion's token ids), every dataset column but ``prompt`` (one value per completion),
  ``trainer_state`` (a ``transformers.TrainerState`` with ``global_step`` and ``max_steps``),
  ``log_extra(column, values)`` and ``log_metric(name, value)``, and in an ``environment_factory`` run
  ``environments`` (each completion's environment instance). It returns one value per completion. A
  function that takes ``**kwargs`` gets all of these, one without it the ones it names; it may also
  name ``samples`` to get the task rows as per-completion rewards see them (the built-in batch
  rewards, e.g. the code sandbox and the reward model, do).

A value of None means the reward does not apply to that completion's row (TRL's convention): it is
left out of that row's weighted sum. Anything but a number or None, and a batch result that is not a
list of one value per completion, is the reward's bug: an error naming it (RewardShapeError, a
ConfigError) at the first batch, not a counted failure.
"""

from __future__ import annotations

import inspect
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable

from grpo.errors import ConfigError

class RewardShapeError(ConfigError):
    """A reward returned something of the wrong shape or type: its bug, which stops the run at once."""


BATCH_PARAMETER = "completions"
ROWS_PARAMETER = "samples"  # grpo's addition to TRL's arguments: only for a function that names it
TRL_ARGUMENTS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric",
                 "environments")


def _parameters(fn) -> dict[str, inspect.Parameter] | None:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin or extension callable without a signature: per completion
        return None


def is_batch_reward(fn) -> bool:
    """Whether ``fn`` is a reward of TRL's per-batch form (a parameter named ``completions``)."""
    params = _parameters(fn)
    return params is not None and BATCH_PARAMETER in params


@dataclass
class RewardLog:
    """What batch rewards logged through ``log_metric`` (name -> values) and ``log_extra`` (column ->
    one value per completion)."""

    metrics: dict[str, list[float]] = field(default_factory=dict)
    columns: dict[str, list] = field(default_factory=dict)

    def log_metric(self, name: str, value: float) -> None:
        self.metrics.setdefault(str(name), []).append(float(value))

    def log_extra(self, column: str, values: list) -> None:
        self.columns.setdefault(str(column), []).extend(list(values))


@dataclass(frozen=True)
class StepPosition:
    """Where training stands, for a reward that takes TRL's ``trainer_state``: a ``TrainerState`` is
    built from it only for such a reward (importing transformers' TrainerState imports peft and
    bitsandbytes, seconds at every start of a process)."""

    global_step: int
    max_steps: int


@dataclass
class BatchInputs:
    """One batch of completions to score.

    texts: each completion's text (a multi-turn episode's: its final answer); samples: each one's task
    row; episodes: each one's episode info (tools / environment runs: ``transcript``,
    ``completion_messages``, counts, ``environment``), else None; completion_ids: each one's token ids;
    trainer_state: what batch rewards get as ``trainer_state``: a StepPosition (made a TrainerState), a
    TrainerState, or None (a fresh TrainerState)."""

    texts: list[str]
    samples: list[dict]
    episodes: list[dict] | None = None
    completion_ids: list[list[int]] | None = None
    trainer_state: Any = None
    log: RewardLog = field(default_factory=RewardLog)

    def __post_init__(self):
        n = len(self.texts)
        for what, rows in (("samples", self.samples), ("episodes", self.episodes), ("completion_ids", self.completion_ids)):
            if rows is not None and len(rows) != n:
                raise ValueError(f"score_completions: {n} completions but {len(rows)} {what}")

    def rows(self) -> list[dict]:
        """What a per-completion reward gets: the task row with its episode's info beside it (the
        environment instance left out: it stays in this process)."""
        if self.episodes is None:
            return self.samples
        return [{**s, **{k: v for k, v in e.items() if k != "environment"}} for s, e in zip(self.samples, self.episodes)]

    def trl_completions(self) -> list:
        """``completions`` as TRL passes them: the text for a plain-text prompt, a list of messages for
        a conversational prompt (the assistant's message) or a multi-turn episode (every message after
        the prompt: the model's turns and the tools' results)."""
        if self.episodes is not None:
            return [list(e.get("completion_messages") or [{"role": "assistant", "content": t}])
                    for t, e in zip(self.texts, self.episodes)]
        return [[{"role": "assistant", "content": t}] if isinstance(s.get("prompt"), list) else t
                for t, s in zip(self.texts, self.samples)]

    def columns(self) -> list[str]:
        """The dataset columns a batch reward gets as keyword lists: every key of the rows but the prompt."""
        return list(dict.fromkeys(k for s in self.samples for k in s if k != "prompt" and k not in TRL_ARGUMENTS))

    def offered(self) -> dict[str, Callable[[], Any]]:
        """Every keyword argument a batch reward can be given (TRL's and the columns), each as a
        function that makes it: only what the reward takes is built."""
        kw: dict[str, Callable[[], Any]] = {k: (lambda k=k: [s.get(k) for s in self.samples]) for k in self.columns()}
        ids = self.completion_ids if self.completion_ids is not None else [[] for _ in self.texts]
        kw.update(prompts=lambda: [s.get("prompt") for s in self.samples], completions=self.trl_completions,
                  completion_ids=lambda: [list(x) for x in ids], trainer_state=self._trainer_state,
                  log_extra=lambda: self.log.log_extra, log_metric=lambda: self.log.log_metric)
        if self.episodes is not None and any(e.get("environment") is not None for e in self.episodes):
            kw["environments"] = lambda: [e.get("environment") for e in self.episodes]
        return kw

    def _trainer_state(self):
        from transformers import TrainerState

        state = self.trainer_state
        if isinstance(state, StepPosition):
            return TrainerState(global_step=state.global_step, max_steps=state.max_steps)
        return state if state is not None else TrainerState()  # a fresh one: step 0 (evaluation outside training)


def batch_kwargs(name: str, fn, inputs: BatchInputs) -> dict[str, Any]:
    """The keyword arguments of one call of the batch reward ``fn``: all of TRL's (and every column)
    when it takes ``**kwargs``, else the ones it names; ``samples`` only when named. A parameter
    without a default that names nothing offered is a ConfigError naming the reward."""
    params = _parameters(fn) or {}
    offered = inputs.offered()
    named = {p.name for p in params.values() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kw = {k: make() for k, make in offered.items()}
    else:
        kw = {k: make() for k, make in offered.items() if k in named}
    if ROWS_PARAMETER in named:
        kw[ROWS_PARAMETER] = inputs.rows()
    missing = [p.name for p in params.values() if p.name not in kw and p.default is p.empty
               and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if missing:
        columns = sorted(k for k in offered if k not in TRL_ARGUMENTS)
        raise ConfigError(f"rewards: {name!r} takes {missing[0]!r}, which is neither one of TRL's reward arguments "
                          f"({', '.join(TRL_ARGUMENTS)}) nor a column of the dataset (columns: {', '.join(columns)})")
    return kw


def call_batch(name: str, fn, inputs: BatchInputs, run_awaitable: Callable) -> list:
    """One call of a batch reward: its values as a list of length N, or its exception once per
    completion (then every completion of the batch failed). A result of the wrong shape raises."""
    n = len(inputs.texts)
    kw = batch_kwargs(name, fn, inputs)
    try:
        out = fn(**kw)
        if inspect.isawaitable(out):  # an async def reward of TRL's form: awaited once per batch
            out = run_awaitable(out)
    except Exception as e:  # a reward is user code: its failure is this batch's, not the run's
        return [e] * n
    return batch_values(name, out, n)


def batch_values(name: str, out, n: int) -> list:
    """``out``, a batch reward's result, as a list of N outcomes; the wrong shape raises RewardShapeError."""
    if hasattr(out, "tolist") and getattr(out, "ndim", 1) == 1:  # a 1-d tensor or array
        out = out.tolist()
    if not isinstance(out, (list, tuple)):
        raise RewardShapeError(f"rewards: {name!r} (TRL's batch form: it takes `completions`) returned "
                          f"{type(out).__name__} {out!r:.60}, not a list of one value per completion")
    if len(out) != n:
        raise RewardShapeError(f"rewards: {name!r} returned {len(out)} values for {n} completions; a batch reward "
                          f"returns one value (a number or None) per completion")
    return list(out)


def completion_values(name: str, fn, texts: list[str], rows: list[dict]) -> list:
    """A per-completion reward's outcome for each completion: what it returned, or the exception it raised."""
    outs = []
    for text, row in zip(texts, rows):
        try:
            outs.append(fn(text, row))
        except Exception as e:  # one completion's failure
            outs.append(e)
    return outs


def check_value(name: str, value, *, batch: bool) -> float | None:
    """A reward's value for one completion as a float, or None (not applicable). NaN and inf raise
    ValueError (a counted failure of that completion); any other type is the reward's bug: RewardShapeError."""
    if value is None:
        return None
    if isinstance(value, (numbers.Real, bool)) or (hasattr(value, "item") and getattr(value, "ndim", 1) == 0):
        x = float(value)
        if not math.isfinite(x):
            raise ValueError(f"returned non-finite {x!r}")
        return x
    if isinstance(value, (list, tuple)) and not batch:
        raise RewardShapeError(f"rewards: {name!r} returned a list ({len(value)} values) for one completion: a reward "
                          f"fn(completion, sample) returns one number or None; a reward that scores a whole batch "
                          f"(TRL's form) takes a parameter named `completions`")
    raise RewardShapeError(f"rewards: {name!r} returned {type(value).__name__} {value!r:.60}"
                      f"{' in its list' if batch else ''}, not a number or None")
