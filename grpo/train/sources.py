"""A run's sources of prompts and its evaluation suites.

A plain run has one task, one reward set and at most one set of tools or environment. A mixture
(``task=arithmetic:0.5,calculator:0.5``, grpo.data.mixture) gives each source its own task, rewards,
tools, environment and presets, its rows tagged by the ``task`` column; TRL's dict
``environment_factory`` routes the rows of one dataset by a column (``environment_column``).
Evaluation suites (a mixture's sources, a routed dataset's column values, ``eval_tasks``) are each
evaluated and logged under their label.

Dimension letters: N completions.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from pathlib import Path

import torch

from grpo.agent import AgentSampler
from grpo.agent.environments import is_routed, load_factories, load_factory
from grpo.agent.formats import call_format
from grpo.agent.tools import resolve_callable, resolve_tools
from grpo.config.presets import TASK_PRESETS
from grpo.data import PromptSampler, Task, load_task, task_of
from grpo.data.difficulty import DifficultySampler
from grpo.data.mixture import SOURCE_COLUMN, SOURCE_SETTINGS, MixtureSampler, Source, parse_mixture, tag_rows
from grpo.data.tasks import rows_task
from grpo.errors import ConfigError, DataError
from grpo.eval.suites import Suite
from grpo.rewards.runner import RewardRunner
from grpo.rewards.verdict import first_applicable
from grpo.train.source_rewards import SourceRewards


@dataclass(frozen=True)
class SamplerSettings:
    """How a source's prompts are drawn: epoch-shuffled, or by difficulty (grpo.data.difficulty)."""

    seed: int
    difficulty: bool = False
    memory: int = 4
    floor: float = 0.1

    @classmethod
    def of(cls, cfg) -> "SamplerSettings":
        return cls(seed=cfg.seed, difficulty=cfg.difficulty_sampling, memory=cfg.difficulty_memory,
                   floor=cfg.difficulty_floor)

    def sampler(self, size: int, seed: int):
        if self.difficulty:
            return DifficultySampler(size, seed=seed, memory=self.memory, floor=self.floor)
        return PromptSampler(size, seed=seed)


@dataclass
class SourceRun:
    """One source, loaded: its task (rows tagged with its label), reward runner, tools and environment."""

    label: str
    weight: float
    task: Task
    rewards: RewardRunner
    tools: str
    environment: str

    @property
    def verifier(self) -> dict:
        first = self.rewards.names[0]
        return {first: self.rewards.fns[first]}


def source_settings(cfg, source: Source) -> dict:
    """A source's SOURCE_SETTINGS: its own, else its built-in task's preset where the run's value is
    still the default, else the run's."""
    defaults = {f.name: f.default for f in dataclasses.fields(type(cfg))}
    preset = TASK_PRESETS.get(source.name, {})
    out = {}
    for key in SOURCE_SETTINGS:
        if key in source.settings:
            out[key] = source.settings[key]
        elif key in preset and getattr(cfg, key) == defaults[key]:
            out[key] = preset[key]
        else:
            out[key] = getattr(cfg, key)
    return out


def _owned_dataset(name: str):
    """The environment class a ``module:Class`` source names when that class owns its dataset (a
    ``dataset`` attribute: rows, or a function returning them), else None."""
    if ":" not in name or Path(name).exists():
        return None
    cls = resolve_callable(name, "task")
    if not hasattr(cls, "dataset"):
        raise ConfigError(f"task: {name!r} is an environment without a dataset (give it a `dataset` attribute or "
                          "classmethod returning rows)")
    return cls


def load_source(cfg, source: Source, *, given: dict | None) -> SourceRun:
    """A source's task, rows tagged with its label, and its own reward runner."""
    s = source_settings(cfg, source)
    env_cls = _owned_dataset(source.name)
    if env_cls is not None:
        rows = env_cls.dataset() if inspect.ismethod(env_cls.dataset) or inspect.isfunction(env_cls.dataset) \
            else env_cls.dataset
        task = rows_task(source.label, [dict(r) for r in rows], where=source.name, prompt_field=cfg.prompt_field,
                         answer_field=cfg.answer_field, eval_size=s["eval_prompts"])
        s["environment_factory"] = s["environment_factory"] or source.name
    else:
        task = load_task(source.name, eval_size=s["eval_prompts"], max_operand=cfg.arithmetic_max_operand,
                         ops=cfg.arithmetic_ops, prompt_field=cfg.prompt_field, answer_field=cfg.answer_field,
                         split=cfg.task_split)
    names = [r.strip() for r in str(s["rewards"]).split(",") if r.strip()]
    weights = s["reward_weights"]
    if weights is not None and len(weights) != len(names):
        raise ConfigError(f"task: source {source.label!r}: {len(weights)} reward_weights for {len(names)} rewards")
    runner = RewardRunner(names, weights, timeout=cfg.reward_timeout, workers=cfg.reward_workers,
                          reward_model=cfg.reward_model, retries=cfg.reward_retries,
                          concurrency=cfg.reward_concurrency, given=given)
    tagged = Task(source.label, train=tag_rows(task.train, source.label), eval=tag_rows(task.eval, source.label))
    return SourceRun(source.label, source.weight, tagged, runner, s["tools"], s["environment_factory"])


def mixture_sources(cfg) -> list[Source] | None:
    """The sources ``task`` names, or None for a plain run (one task; an environment class that owns
    its dataset is a source of its own)."""
    sources = parse_mixture(cfg.task)
    if sources is None and _owned_dataset(cfg.task.strip()) is not None:
        sources = [Source(cfg.task.strip())]
    return sources


@dataclass
class RunSources:
    """What a run draws, scores and evaluates: its task, rewards (a runner, or one per source), prompt
    stream, per-source labels (metrics), evaluation suites ([]: the plain held-out evaluation) and
    the tools and environment of each label (``routes``: label -> (tools, environment_factory))."""

    task: Task
    rewards: RewardRunner | SourceRewards
    sampler: object
    labels: list[str] = field(default_factory=list)
    suites: list[Suite] = field(default_factory=list)
    routes: dict[str, tuple[str, str]] = field(default_factory=dict)
    column: str = SOURCE_COLUMN
    eval_runners: list[RewardRunner] = field(default_factory=list)
    routed_rows: bool = False  # the rows of the training set are routed to their tools and environment
    any_applicable: bool = False  # a row's verdict is the first reward that applies (TRL's multi-task reward sets)

    def verdict_values(self, samples: list[dict], per_reward: dict[str, torch.Tensor]) -> torch.Tensor:
        """Each row's verdict value [N] (grpo.rewards.verdict): its source's first reward; with a
        routed dataset the first reward that applies to it; else the run's first reward."""
        if isinstance(self.rewards, SourceRewards):
            return self.rewards.verdict_values(samples, per_reward)
        if self.any_applicable:
            return first_applicable(per_reward, self.rewards.names)
        return per_reward[self.rewards.names[0]]

    def agents(self, cfg, tokenizer) -> tuple[AgentSampler | None, AgentSampler | None]:
        """The agent that samples training rows (None: plain generation) and the one evaluation
        suites with tools use (every label routed to its tools and environment)."""
        train = AgentSampler.from_config(cfg, tokenizer)
        if not self.routes:
            return train, train
        routes = {k: (resolve_tools(t), load_factory(e) if e.strip() else None) for k, (t, e) in self.routes.items()}
        if train is not None and train.routes:  # a routed dataset's own routes come first
            routes = {**routes, **train.routes}
        needed = any(tools or factory for tools, factory in routes.values())
        if not needed:
            return train, train
        base = train or AgentSampler(tokenizer, tools=[], fmt=call_format(cfg.tool_format, tokenizer),
                                     max_turns=cfg.max_turns, tool_timeout=cfg.tool_timeout,
                                     example_call=cfg.tool_example_call, example_question=cfg.tool_example_question)
        routed = AgentSampler(tokenizer, tools=base.tools, factory=base.factory, fmt=base.fmt, max_turns=base.max_turns,
                              tool_timeout=base.tool_timeout, example_call=base.example_call,
                              example_question=base.example_question, routes=routes, column=self.column)
        return (routed if self.routed_rows else train), routed

    def assign_agents(self, train: AgentSampler | None, routed: AgentSampler | None) -> None:
        """Each suite's agent: the routed one for a label with tools or an environment of its own, else
        the one training rows are sampled with."""
        for suite in self.suites:
            suite.agent = routed if (suite.label in self.routes or self.routed_rows) else train

    def close(self) -> None:
        for runner in self.eval_runners:
            runner.close()


def _main_runner(cfg, given) -> RewardRunner:
    return RewardRunner(cfg.reward_names, cfg.reward_weights, timeout=cfg.reward_timeout, workers=cfg.reward_workers,
                        reward_model=cfg.reward_model, retries=cfg.reward_retries,
                        concurrency=cfg.reward_concurrency, given=given)


def plan_sources(cfg, *, task: Task | None = None, given: dict | None = None) -> RunSources:
    """A run's sources (module docstring); ``task``: a task handed over (the Python API's dataset)."""
    settings = SamplerSettings.of(cfg)
    sources = mixture_sources(cfg) if task is None else None
    if sources:
        runs = [load_source(cfg, s, given=given) for s in sources]
        mixed = Task("mixture", train=[r for x in runs for r in x.task.train], eval=[r for x in runs for r in x.task.eval])
        sampler = MixtureSampler([len(x.task.train) for x in runs], [x.weight for x in runs],
                                 [settings.sampler(len(x.task.train), cfg.seed * 1_000 + i) for i, x in enumerate(runs)],
                                 seed=cfg.seed)
        plan = RunSources(mixed, SourceRewards({x.label: x.rewards for x in runs}), sampler,
                          labels=[x.label for x in runs],
                          suites=[Suite(x.label, x.task.eval, x.verifier) for x in runs if x.task.eval],
                          routes={x.label: (x.tools, x.environment) for x in runs}, routed_rows=True)
    else:
        runner = _main_runner(cfg, given)
        task = task or task_of(cfg)
        if not task.train:
            raise DataError(f"task {cfg.task!r} has no training prompts")
        plan = RunSources(task, runner, settings.sampler(len(task.train), cfg.seed), column=cfg.environment_column)
        if is_routed(cfg.environment_factory):
            _column_suites(plan, cfg, runner)
    _add_eval_tasks(plan, cfg, given)
    return plan


def _column_suites(plan: RunSources, cfg, runner: RewardRunner) -> None:
    """TRL's dict environment_factory: the column's values label the metrics, and the held-out rows of
    each value are a suite judged by the first reward that applies to them."""
    col, routed = cfg.environment_column, sorted(load_factories(cfg.environment_factory))
    values = sorted({str(r.get(col)) for r in plan.task.train} | {str(r.get(col)) for r in plan.task.eval})
    missing = [v for v in values if v not in routed]
    if missing:
        raise DataError(f"environment_factory: the dataset's {col!r} column holds {missing}, which no environment "
                        f"is routed to (routed: {routed})")
    plan.labels, plan.any_applicable = values, True
    plan.suites = [Suite(v, rows, dict(runner.fns)) for v in values
                   if (rows := [r for r in plan.task.eval if str(r.get(col)) == v])]


def _add_eval_tasks(plan: RunSources, cfg, given) -> None:
    """``eval_tasks``: suites of their own, each with its task's rewards, tools and presets."""
    names = [n.strip() for n in cfg.eval_tasks.split(",") if n.strip()]
    if not names:
        return
    if not plan.suites and plan.task.eval:  # the run's own held-out set is a suite too, judged as before
        first = plan.rewards.names[0]
        plan.suites.append(Suite(Source(cfg.task).label, plan.task.eval, {first: plan.rewards.fns[first]}))
    for name in names:
        run = load_source(cfg, Source(name), given=given)
        if run.label in {s.label for s in plan.suites}:
            raise ConfigError(f"eval_tasks: {name!r} is already evaluated (suite {run.label!r})")
        if not run.task.eval:
            raise ConfigError(f"eval_tasks: {name!r} has no held-out prompts (eval_prompts)")
        plan.eval_runners.append(run.rewards)
        plan.suites.append(Suite(run.label, run.task.eval, run.verifier))
        plan.routes[run.label] = (run.tools, run.environment)
