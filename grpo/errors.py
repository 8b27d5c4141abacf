"""Errors that stop a run. Each message names the field, file or row at fault and what to do; the
CLI catches them all in one place (``grpo.cli.main``) and prints the message instead of a traceback.
This module imports nothing, so every layer may raise them."""

from __future__ import annotations


class GrpoError(Exception):
    """Base of the errors that end a run with a message (exit code 2)."""


class ConfigError(GrpoError, ValueError):
    """A bad configuration value; the message names the key."""


class DataError(GrpoError, ValueError):
    """A task file or dataset that cannot be used; the message names the file and row."""


class CheckpointError(GrpoError, RuntimeError):
    """A checkpoint that cannot be resumed from; the message names the folder."""


class SandboxError(GrpoError, RuntimeError):
    """The code sandbox (bubblewrap) is missing or does not isolate; the message says how to install it."""


class FuseError(GrpoError, RuntimeError):
    """The fuse stopped the run; the message names the metric, its band and the checkpoint."""


class EngineError(GrpoError, RuntimeError):
    """A rollout engine that stopped working (its process died); the message names the engine and,
    from the trainer, the checkpoint saved."""


class RewardError(GrpoError, RuntimeError):
    """Rewards that could not score a step's completions (max_reward_failure_share) or an evaluation's;
    the message names each failing reward and its first exception and, from the trainer, the checkpoint."""


class ModelNotFoundError(GrpoError, FileNotFoundError):
    """A model or run path that is neither a local folder nor a model found on the hub; the message
    names both readings."""


class UnknownName(ConfigError, KeyError):
    """A name that is not in a registry; the message names the kind of entry and lists the valid names.
    A KeyError too, so ``name in registry`` and ``registry.get(name)`` work as on a dict."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""
