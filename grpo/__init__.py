"""grpo: Group Relative Policy Optimization for language models.

The Python API (grpo.api), shaped as TRL's: ``from grpo import GRPOConfig, GRPOTrainer`` (and TRL's
``AsyncGRPOConfig``, ``AsyncGRPOTrainer``: the same with asynchronous rollouts; ``Config`` is
grpo's own name of the config); the command line: ``grpo train``. The loop itself is
``grpo.train.Trainer``.
"""

__version__ = "0.1.0"

_API = {"GRPOConfig": "grpo.api", "GRPOTrainer": "grpo.api", "AsyncGRPOConfig": "grpo.api",
        "AsyncGRPOTrainer": "grpo.api", "Config": "grpo.config"}
__all__ = list(_API)


def __getattr__(name: str):
    """The API's names, imported on first use (``import grpo`` stays light)."""
    if name in _API:
        import importlib

        from grpo.infra.quiet import quiet_dependencies

        quiet_dependencies()  # before the API's imports bring in bitsandbytes (grpo.infra.quiet)

        return getattr(importlib.import_module(_API[name]), name)
    hint = "; the TRL-shaped trainer is grpo.GRPOTrainer, the loop grpo.train.Trainer" if name == "Trainer" else ""
    raise AttributeError(f"module 'grpo' has no attribute {name!r}{hint}")
