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

import inspect
from dataclasses import dataclass, field
from pathlib import Path

import torch

from grpo.agent import AgentSampler, AgentSettings
from grpo.agent.environments import is_routed, load_factories, load_factory
from grpo.agent.formats import call_format
from grpo.agent.tools import resolve_callable, resolve_tools
from grpo.data import PromptSampler, Task
from grpo.data.difficulty import DifficultySampler
from grpo.data.mixture import SOURCE_COLUMN, MixtureSampler, Source, SourceSpec, tag_rows
from grpo.data.tasks import VERIFIERS, TaskLoading, load_task, rows_task
from grpo.errors import ConfigError, DataError
from grpo.eval.suites import Suite
from grpo.rewards.reward import RewardOptions
from grpo.rewards.runner import RewardRunner
from grpo.rewards.verdict import first_applicable
from grpo.train.source_rewards import SourceRewards


@dataclass(frozen=True)
class SamplerSettings:
    """How a source's prompts are drawn: epoch-shuffled, or by difficulty (grpo.data.difficulty)."""

    seed: int  # seed
    difficulty: bool = False  # difficulty_sampling
    memory: int = 4  # difficulty_memory
    floor: float = 0.1  # difficulty_floor

    def sampler(self, size: int, seed: int):
        if self.difficulty:
            return DifficultySampler(size, seed=seed, memory=self.memory, floor=self.floor)
        return PromptSampler(size, seed=seed)


@dataclass(frozen=True)
class SourcesSettings:
    """What planning a run's sources reads (built in train/settings.py)."""

    task: str  # task: a plain run's (its label names its suite beside eval_tasks)
    eval_prompts: int | None  # eval_prompts: a plain run's held-out size
    rewards: tuple[str, ...]  # rewards: a plain run's, in order
    reward_weights: tuple[float, ...] | None  # reward_weights
    mixture: tuple[SourceSpec, ...] | None  # a mixture's sources, resolved (None: a plain run)
    eval_tasks: tuple[SourceSpec, ...]  # eval_tasks, resolved
    sampler: SamplerSettings
    reward_options: RewardOptions  # how every source's rewards are resolved and run
    loading: TaskLoading
    agent: AgentSettings  # the run's tools, environment_factory (and its routing column), call format


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


def _owned_dataset(name: str):
    """The environment class a ``module:Class`` source names when that class owns its dataset (a
    ``dataset`` attribute: rows, or a function returning them), else None."""
    if ":" not in name or Path(name).exists() or name.startswith(VERIFIERS):
        return None
    cls = resolve_callable(name, "task")
    if not hasattr(cls, "dataset"):
        raise ConfigError(f"task: {name!r} is an environment without a dataset (give it a `dataset` attribute or "
                          "classmethod returning rows)")
    return cls


def source_task(s: SourcesSettings, spec: SourceSpec) -> tuple[Task, str]:
    """A source's task, its rows tagged with its label, and its environment_factory (an environment
    class that owns its dataset is its own environment)."""
    environment = spec.environment_factory
    env_cls = _owned_dataset(spec.name)
    if env_cls is not None:
        rows = env_cls.dataset() if inspect.ismethod(env_cls.dataset) or inspect.isfunction(env_cls.dataset) \
            else env_cls.dataset
        task = rows_task(spec.label, [dict(r) for r in rows], where=spec.name, prompt_field=s.loading.prompt_field,
                         answer_field=s.loading.answer_field, eval_size=spec.eval_prompts)
        environment = environment or spec.name
    else:
        task = load_task(spec.name, eval_size=spec.eval_prompts, loading=s.loading)
    return Task(spec.label, train=tag_rows(task.train, spec.label), eval=tag_rows(task.eval, spec.label)), environment


def load_source(s: SourcesSettings, spec: SourceSpec, *, given: dict | None) -> SourceRun:
    """A source's task (``source_task``) and its own reward runner."""
    task, environment = source_task(s, spec)
    weights = None if spec.reward_weights is None else list(spec.reward_weights)
    runner = RewardRunner(spec.reward_names, weights, s.reward_options, given=given)
    return SourceRun(spec.label, spec.weight, task, runner, spec.tools, environment)


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

    def agents(self, settings: AgentSettings, tokenizer) -> tuple[AgentSampler | None, AgentSampler | None]:
        """The agent that samples training rows (None: plain generation) and the one evaluation
        suites with tools use (every label routed to its tools and environment)."""
        train = AgentSampler.from_settings(settings, tokenizer)
        if not self.routes:
            return train, train
        routes = {k: (resolve_tools(t), load_factory(e) if e.strip() else None) for k, (t, e) in self.routes.items()}
        if train is not None and train.routes:  # a routed dataset's own routes come first
            routes = {**routes, **train.routes}
        needed = any(tools or factory for tools, factory in routes.values())
        if not needed:
            return train, train
        if train is not None and not isinstance(train, AgentSampler):
            raise ConfigError("agent: an agent program runs its own tools; it does not run with sources that bring "
                              "tools or an environment_factory")
        base = train or AgentSampler(tokenizer, tools=[], fmt=call_format(settings.tool_format, tokenizer),
                                     max_turns=settings.max_turns, tool_timeout=settings.tool_timeout,
                                     example_call=settings.example_call, example_question=settings.example_question)
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


def plan_sources(s: SourcesSettings, *, task: Task | None = None, given: dict | None = None) -> RunSources:
    """A run's sources (module docstring); ``task``: a task handed over (the Python API's dataset)."""
    if s.mixture and task is None:
        runs = [load_source(s, spec, given=given) for spec in s.mixture]
        mixed = Task("mixture", train=[r for x in runs for r in x.task.train], eval=[r for x in runs for r in x.task.eval])
        sampler = MixtureSampler([len(x.task.train) for x in runs], [x.weight for x in runs],
                                 [s.sampler.sampler(len(x.task.train), s.sampler.seed * 1_000 + i)
                                  for i, x in enumerate(runs)], seed=s.sampler.seed)
        plan = RunSources(mixed, SourceRewards({x.label: x.rewards for x in runs}), sampler,
                          labels=[x.label for x in runs],
                          suites=[Suite(x.label, x.task.eval, x.verifier) for x in runs if x.task.eval],
                          routes={x.label: (x.tools, x.environment) for x in runs}, routed_rows=True)
    else:
        weights = None if s.reward_weights is None else list(s.reward_weights)
        runner = RewardRunner(list(s.rewards), weights, s.reward_options, given=given)
        task = task or load_task(s.task, eval_size=s.eval_prompts, loading=s.loading)
        if not task.train:
            raise DataError(f"task {s.task!r} has no training prompts")
        plan = RunSources(task, runner, s.sampler.sampler(len(task.train), s.sampler.seed),
                          column=s.agent.environment_column)
        if is_routed(s.agent.environment_factory):
            _column_suites(plan, s.agent, runner)
    _add_eval_tasks(plan, s, given)
    return plan


def _column_suites(plan: RunSources, agent: AgentSettings, runner: RewardRunner) -> None:
    """TRL's dict environment_factory: the column's values label the metrics, and the held-out rows of
    each value are a suite judged by the first reward that applies to them."""
    col, routed = agent.environment_column, sorted(load_factories(agent.environment_factory))
    values = sorted({str(r.get(col)) for r in plan.task.train} | {str(r.get(col)) for r in plan.task.eval})
    missing = [v for v in values if v not in routed]
    if missing:
        raise DataError(f"environment_factory: the dataset's {col!r} column holds {missing}, which no environment "
                        f"is routed to (routed: {routed})")
    plan.labels, plan.any_applicable = values, True
    plan.suites = [Suite(v, rows, dict(runner.fns)) for v in values
                   if (rows := [r for r in plan.task.eval if str(r.get(col)) == v])]


def _add_eval_tasks(plan: RunSources, s: SourcesSettings, given) -> None:
    """``eval_tasks``: suites of their own, each with its task's rewards, tools and presets."""
    if not s.eval_tasks:
        return
    if not plan.suites and plan.task.eval:  # the run's own held-out set is a suite too, judged as before
        first = plan.rewards.names[0]
        plan.suites.append(Suite(Source(s.task).label, plan.task.eval, {first: plan.rewards.fns[first]}))
    for spec in s.eval_tasks:
        run = load_source(s, spec, given=given)
        if run.label in {x.label for x in plan.suites}:
            raise ConfigError(f"eval_tasks: {spec.name!r} is already evaluated (suite {run.label!r})")
        if not run.task.eval:
            raise ConfigError(f"eval_tasks: {spec.name!r} has no held-out prompts (eval_prompts)")
        plan.eval_runners.append(run.rewards)
        plan.suites.append(Suite(run.label, run.task.eval, run.verifier))
        plan.routes[run.label] = (run.tools, run.environment)
