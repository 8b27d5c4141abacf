"""Experiment trackers (``report_to``): TensorBoard, Weights & Biases, Trackio and MLflow.

Each entry of ``TRACKERS`` starts a tracker for one run folder and returns an object with
``log(step, metrics)`` and ``close()``. Every tracker of a run gets the same numeric metrics at the same
step numbers (the lines of metrics.jsonl) and the run's whole config once. A resumed run continues the
tracker run of its folder (one id per run folder). A tracker that raises once the run is under way is
switched off with one warning; the run, metrics.jsonl and the other trackers go on (``Trackers``).
A resumed run's TensorBoard events after its checkpoint are purged; W&B keeps the steps it had (it drops a
step it has seen), MLflow and Trackio keep both values of a step logged again after a resume.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from grpo.registry import Registry

PROJECT = "grpo"  # the project / experiment a run goes to where the tracker's own variable names none
PARAM_CHARS = 6000  # the longest parameter value MLflow stores


@dataclass(frozen=True)
class TrackerKind:
    """A registry entry: the package it needs, how to install it, and its start function
    ``start(run_dir, run_id, params, start_step) -> object with log(step, metrics) and close()``."""

    module: str
    install: str
    start: Callable[[Path, str, dict], Any]
    doc: str


def run_id(run_dir: Path) -> str:
    """One id per run folder, so a resumed run continues its tracker run."""
    return hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


def numeric(metrics: dict) -> dict[str, float]:
    """The metrics a tracker can plot: finite numbers (booleans and text are left to metrics.jsonl)."""
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def mlflow_key(name: str) -> str:
    """A metric name in MLflow's alphabet (letters, digits, _ - . / space and colon): '@' as '_at_', any
    other character as '_'."""
    return re.sub(r"[^\w\-./ :]", "_", name.replace("@", "_at_"))


class _TensorBoard:
    def __init__(self, run_dir: Path, rid: str, params: dict, start_step: int = 0):
        from torch.utils.tensorboard import SummaryWriter

        # a resumed run: events after its checkpoint's step (written by the run that died) are purged
        self.w = SummaryWriter(str(run_dir / "tensorboard"), purge_step=start_step + 1 if start_step else None)
        self.w.add_text("config", "```json\n" + json.dumps(params, indent=1, default=str) + "\n```")

    def log(self, step: int, metrics: dict) -> None:
        for k, v in numeric(metrics).items():
            self.w.add_scalar(k, v, step)

    def close(self) -> None:
        self.w.close()


class _Wandb:
    """W&B (``WANDB_MODE=offline`` writes to the run folder's wandb/ without an account; ``wandb sync``
    uploads it later). Project: ``$WANDB_PROJECT`` or grpo."""

    def __init__(self, run_dir: Path, rid: str, params: dict, start_step: int = 0):
        import wandb

        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT") or PROJECT, name=run_dir.name,
                              dir=str(run_dir), config=params, resume="allow", id=rid)

    def log(self, step: int, metrics: dict) -> None:
        self.run.log(numeric(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class _Trackio:
    """Trackio (local SQLite under ``$TRACKIO_DIR``, default ~/.cache/huggingface/trackio; ``trackio
    show`` opens the dashboard). Project: ``$TRACKIO_PROJECT`` or grpo; the run is named after its folder
    and id."""

    def __init__(self, run_dir: Path, rid: str, params: dict, start_step: int = 0):
        import trackio

        self.run = trackio.init(project=os.environ.get("TRACKIO_PROJECT") or PROJECT,
                                name=f"{run_dir.name}-{rid[:8]}", config=params, resume="allow", embed=False)

    def log(self, step: int, metrics: dict) -> None:
        self.run.log(numeric(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class _MLflow:
    """MLflow through its client (no process-wide active run): ``$MLFLOW_TRACKING_URI`` (a server, a database,
    a ``file:`` folder; unset: MLflow's default, ./mlflow.db), experiment ``$MLFLOW_EXPERIMENT_NAME`` or grpo;
    the config as parameters (nested values as JSON text, each cut to MLflow's 6000 characters); metric names
    in MLflow's alphabet (``eval/pass@k`` as ``eval/pass_at_k``); the run is found again by its
    ``grpo.run_id`` tag on resume."""

    def __init__(self, run_dir: Path, rid: str, params: dict, start_step: int = 0):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient()
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or PROJECT
        exp = self.client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(name)
        found = self.client.search_runs([exp_id], filter_string=f"tags.`grpo.run_id` = '{rid}'", max_results=1)
        if found:
            self.run_id = found[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            self.run_id = self.client.create_run(exp_id, run_name=run_dir.name, tags={"grpo.run_id": rid,
                                                 "grpo.run_dir": str(run_dir.resolve())}).info.run_id
            params = [Param(k, (v if isinstance(v, str) else json.dumps(v, default=str))[:PARAM_CHARS])
                      for k, v in sorted(params.items())]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters a call
                self.client.log_batch(self.run_id, params=params[i:i + 100])

    def log(self, step: int, metrics: dict) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(mlflow_key(k), v, now, step) for k, v in numeric(metrics).items()]
        for i in range(0, len(batch), 1000):  # MLflow takes at most 1000 metrics a call
            self.client.log_batch(self.run_id, metrics=batch[i:i + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


TRACKERS: Registry[TrackerKind] = Registry("tracker", field="report_to")
TRACKERS.register("tensorboard", TrackerKind("tensorboard", "pip install tensorboard", _TensorBoard,
                                             "TensorBoard event files in the run folder's tensorboard/."))
TRACKERS.register("wandb", TrackerKind("wandb", "pip install 'grpo[wandb]'", _Wandb, _Wandb.__doc__))
TRACKERS.register("trackio", TrackerKind("trackio", "pip install 'grpo[trackio]'", _Trackio, _Trackio.__doc__))
TRACKERS.register("mlflow", TrackerKind("mlflow", "pip install 'grpo[mlflow]'", _MLflow, _MLflow.__doc__))


def tracker_names(report_to: str) -> list[str]:
    """The trackers a ``report_to`` value names: a comma list; none (or empty) for none; all for every
    installed one."""
    names = [n.strip() for n in str(report_to).split(",") if n.strip()]
    if names in ([], ["none"]):
        return []
    if names == ["all"]:
        return [n for n, k in TRACKERS.items() if importlib.util.find_spec(k.module) is not None]
    return names


def missing_package(name: str) -> str | None:
    """Why tracker ``name`` cannot start here (its package is not installed), or None; tensorboard is a
    dependency of grpo's, not looked for (a removed one is an ImportError naming it at the start)."""
    kind = TRACKERS[name]
    if name != "tensorboard" and importlib.util.find_spec(kind.module) is None:
        return f"report_to: {name} needs the {kind.module} package, which is not installed ({kind.install})"
    return None


class Trackers:
    """The run's trackers: each started here (an error at the start stops the run before it trains,
    naming the tracker), then given every logged step; one that raises later is dropped with a warning."""

    def __init__(self, names: list[str], run_dir: Path, params: dict, *, start_step: int = 0,
                 warn: Callable[[str], None] | None = None):
        self.live: dict[str, Any] = {}
        self.warn = warn or (lambda text: warnings.warn(text, RuntimeWarning, stacklevel=4))
        rid = run_id(run_dir)
        for name in names:
            try:
                self.live[name] = TRACKERS[name].start(run_dir, rid, params, start_step)
            except ImportError as e:
                self.close()
                raise ImportError(missing_package(name) or f"report_to: {name}: {e}") from None
            except Exception as e:
                self.close()
                raise RuntimeError(f"report_to: {name} could not start ({type(e).__name__}: {str(e)[:300]})") from e

    def log(self, step: int, metrics: dict) -> None:
        for name in list(self.live):
            try:
                self.live[name].log(step, metrics)
            except Exception as e:  # a tracker's failure never stops the run: metrics.jsonl has every step
                self._drop(name, f"failed at step {step}", e)

    def _drop(self, name: str, what: str, e: Exception) -> None:
        self.live.pop(name, None)
        self.warn(f"report_to: {name} {what} ({type(e).__name__}: {str(e)[:300]}); it gets no more metrics, "
                  "and the run goes on (metrics.jsonl has every step)")

    def close(self) -> None:
        for name in list(self.live):
            tracker = self.live.pop(name)
            try:
                tracker.close()
            except Exception as e:
                self._drop(name, "failed to close", e)
