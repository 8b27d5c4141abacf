"""Presets: one key sets a group of fields (a seed's published monitor settings, a built-in task's needs)."""

from __future__ import annotations

from dataclasses import fields

from grpo.errors import ConfigError

# seed 003 section 3.4: TLCR held in 35-45% by +-0.02 on epsilon after 10 steps below 30% / above 50%;
# a fuse when GAV stays above 0.45 for 5 steps; CGC every 100 steps on 10 random prompts x 4 samples.
MONITOR_PRESETS: dict[str, dict] = {
    "none": {},
    "seed003": {
        "clip_step_band": [0.30, 0.50], "clip_step_size": 0.02, "clip_step_patience": 10,
        "fuse_metric": "gav", "fuse_max": 0.45, "fuse_patience": 5,
        "consistency_steps": 100, "consistency_prompts": 10, "consistency_group_size": 4,
        "consistency_random": True,
    },
}


# settings a built-in task needs, filled where still at their defaults (an explicit setting wins).
# calculator: an episode (the call, the tool's result turn, the answer) needs ~45 tokens, more than 32;
# a step of 32 two-turn episodes takes ~3x a default arithmetic step, and the training accuracy
# passes 90% by step 3 on the 2-core AVX2 CPU, so 10 steps and 100 held-out problems keep the whole
# default run within 15 minutes there
TASK_PRESETS: dict[str, dict] = {
    "calculator": {"tools": "builtin:calculator", "max_completion_length": 64, "eval_max_new_tokens": 64,
                   "eval_prompts": 100, "eval_pass_prompts": 20, "max_steps": 10},
}


# "GRPO: not an upgrade of PPO but a scalpel for LLM reasoning" (Towards AI, 2025, section 3.4): GRPO's
# token-level updates want a smaller rate than PPO's usual 3e-6; linear warm-up over 100 steps, cosine
# decay, peak 1.2e-6 was the steadiest there
LR_PRESETS: dict[str, dict] = {
    "none": {},
    "warmup100_cosine": {"learning_rate": 1.2e-6, "warmup_steps": 100, "lr_scheduler_type": "cosine"},
}


def _fill_defaults(c, values: dict) -> None:
    defaults = {f.name: f.default for f in fields(c)}
    for key, value in values.items():
        if getattr(c, key) == defaults[key]:
            setattr(c, key, value)


def apply_task_preset(c) -> None:
    """Fill the fields a built-in task needs (``TASK_PRESETS``) that are still at their defaults."""
    _fill_defaults(c, TASK_PRESETS.get(c.task, {}))


def apply_monitor_preset(c) -> None:
    """Fill the fields of ``c.monitor_preset`` that are still at their defaults (an explicit setting
    wins); an unknown preset lists the valid ones."""
    if c.monitor_preset not in MONITOR_PRESETS:
        raise ConfigError(f"monitor_preset: {c.monitor_preset!r} is not valid; choose one of {sorted(MONITOR_PRESETS)}")
    _fill_defaults(c, MONITOR_PRESETS[c.monitor_preset])


def apply_lr_preset(c) -> None:
    """Fill the fields of ``c.lr_preset`` still at their defaults; an unknown preset lists the valid ones."""
    if c.lr_preset not in LR_PRESETS:
        raise ConfigError(f"lr_preset: {c.lr_preset!r} is not valid; choose one of {sorted(LR_PRESETS)}")
    _fill_defaults(c, LR_PRESETS[c.lr_preset])
