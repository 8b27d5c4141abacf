"""Named monitor presets: one key sets a group of fields to a seed's published settings."""

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


def apply_monitor_preset(c) -> None:
    """Fill the fields of ``c.monitor_preset`` that are still at their defaults (an explicit setting
    wins); an unknown preset lists the valid ones."""
    if c.monitor_preset not in MONITOR_PRESETS:
        raise ConfigError(f"monitor_preset: {c.monitor_preset!r} is not valid; choose one of {sorted(MONITOR_PRESETS)}")
    defaults = {f.name: f.default for f in fields(c)}
    for key, value in MONITOR_PRESETS[c.monitor_preset].items():
        if getattr(c, key) == defaults[key]:
            setattr(c, key, value)
