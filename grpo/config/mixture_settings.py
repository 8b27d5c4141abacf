"""A mixture's run-level presets and the checks of the mixture, curriculum and evaluation-suite
fields (grpo.data.mixture, grpo.train.sources)."""

from __future__ import annotations

import dataclasses

from grpo.config.presets import TASK_PRESETS
from grpo.data.mixture import parse_mixture
from grpo.errors import ConfigError

# settings one batch shares, taken as the largest any source's preset asks for (a source's own
# rewards, tools, environment and held-out size stay its own: grpo.train.sources)
SHARED_BY_MAX = ("max_completion_length", "eval_max_new_tokens")


def apply_mixture_presets(c) -> None:
    """For a mixture, fill SHARED_BY_MAX where still at its default with the largest value its
    sources' built-in presets set."""
    sources = parse_mixture(c.task)
    if not sources:
        return
    defaults = {f.name: f.default for f in dataclasses.fields(c)}
    for key in SHARED_BY_MAX:
        asked = [TASK_PRESETS.get(s.name, {}).get(key) for s in sources]
        asked = [v for v in asked if v is not None]
        if asked and getattr(c, key) == defaults[key]:
            setattr(c, key, max([defaults[key], *asked]))


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
