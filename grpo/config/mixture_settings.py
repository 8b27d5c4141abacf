"""A mixture's run-level presets, each source's resolved settings, and the checks of the mixture,
curriculum and evaluation-suite fields (grpo.data.mixture, grpo.train.sources)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from grpo.data.mixture import SourceSpec, Source, parse_mixture
from grpo.data.tasks import TASKS, task_rewards
from grpo.errors import ConfigError

# settings one batch shares, taken as the largest any source's preset asks for (a source's own
# rewards, tools, environment and held-out size stay its own: grpo.train.sources)
SHARED_BY_MAX = ("max_completion_length", "eval_max_new_tokens")


def _presets(name: str) -> dict:
    return dict(TASKS[name].presets) if name in TASKS else {}


def mixture_of(c) -> list[Source] | None:
    """The sources ``task`` names, or None for a plain run (one task). An environment class that
    owns its dataset (``module:Class``, not a file) is a source of its own."""
    sources = parse_mixture(c.task)
    name = c.task.strip()
    if sources is None and ":" in name and not Path(name).exists():
        sources = [Source(name)]
    return sources


def apply_mixture_presets(c) -> None:
    """For a mixture, fill SHARED_BY_MAX where still at its default with the largest value its
    sources' built-in presets set."""
    sources = parse_mixture(c.task)
    if not sources:
        return
    defaults = {f.name: f.default for f in dataclasses.fields(c)}
    for key in SHARED_BY_MAX:
        asked = [v for v in (_presets(s.name).get(key) for s in sources) if v is not None]
        if asked and getattr(c, key) == defaults[key]:
            setattr(c, key, max([d for d in (defaults[key],) if d is not None] + asked))


def source_spec(c, source: Source, *, run_rewards: bool = True) -> SourceSpec:
    """A source's settings: its own, else its built-in task's preset where the run's value is still
    the default, else the run's. Its rewards: its own, else the run's ``rewards`` where set (and
    ``run_rewards``), else its task's (``task_rewards``); reward_weights go with the rewards they weigh,
    and a source's own weigh whichever of these it is scored with."""
    defaults = {f.name: f.default for f in dataclasses.fields(c)}
    preset, own = _presets(source.name), source.settings

    def pick(key):
        if key in own:
            return own[key]
        if key in preset and getattr(c, key) == defaults[key]:
            return preset[key]
        return getattr(c, key)

    if "rewards" in own:
        rewards, weights = str(own["rewards"]), own.get("reward_weights")
    elif run_rewards and c.rewards.strip():
        rewards, weights = c.rewards, c.reward_weights
    else:
        rewards, weights = task_rewards(source.name), None
    if "reward_weights" in own:  # a source's own weights, for its own rewards or those it is scored with
        weights = own["reward_weights"]
    names = [r for r in rewards.split(",") if r.strip()]
    if weights is not None and len(weights) != len(names):
        raise ConfigError(f"task: source {source.label!r}: {len(weights)} reward_weights for {len(names)} rewards")
    return SourceSpec(source.name, source.label, source.weight, rewards,
                      None if weights is None else tuple(float(w) for w in weights), pick("tools"),
                      pick("environment_factory"), pick("eval_prompts"))


def source_specs(c) -> tuple[SourceSpec, ...] | None:
    """The resolved sources of a mixture (``source_spec``), or None for a plain run."""
    sources = mixture_of(c)
    return None if sources is None else tuple(source_spec(c, s) for s in sources)


def eval_task_specs(c) -> tuple[SourceSpec, ...]:
    """``eval_tasks``: each a suite with its task's own rewards (the run's belong to its own task)."""
    names = [n.strip() for n in c.eval_tasks.split(",") if n.strip()]
    return tuple(source_spec(c, Source(n), run_rewards=False) for n in names)


def validate_mixture(c) -> None:
    """The mixture, difficulty sampler and best-checkpoint fields, each error naming its field."""
    sources = parse_mixture(c.task)
    if sources and c.multi_objective_aggregation == "normalize_then_sum":
        raise ConfigError("multi_objective_aggregation: normalize_then_sum weighs one reward set; a mixture's sources "
                          "each have their own (use sum_then_normalize)")
    if c.difficulty_memory < 1:
        raise ConfigError(f"difficulty_memory: {c.difficulty_memory} must be at least 1")
    if not 0.0 < c.difficulty_floor <= 1.0:
        raise ConfigError(f"difficulty_floor: {c.difficulty_floor} must be in (0, 1]")
    if c.best_checkpoint_metric:
        if not c.best_checkpoint_metric.startswith("eval/"):
            raise ConfigError(f"best_checkpoint_metric: {c.best_checkpoint_metric!r} is not an evaluation metric "
                              "(eval/accuracy, eval/<suite>/accuracy, eval/pass@k, ...)")
        if not c.eval_steps:
            raise ConfigError("best_checkpoint_metric: needs eval_steps > 0 (the evaluations it chooses among)")
    if c.best_checkpoint_mode not in ("max", "min"):
        raise ConfigError(f"best_checkpoint_mode: {c.best_checkpoint_mode!r} is not valid; choose one of ['max', 'min']")
