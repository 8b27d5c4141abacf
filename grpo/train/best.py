"""The best checkpoint: the weights of the evaluation during training (eval_steps) with the best
value of a named metric (``best_checkpoint_metric``, e.g. eval/accuracy or eval/<suite>/accuracy),
kept in the run folder's ``best/`` (a transformers folder, with ``best.json`` naming the step and
value), as TRL's ``metric_for_best_model`` selects and verl and OpenRLHF keep theirs. Which step is
best so far is part of the checkpoint, so a resumed run replaces ``best/`` only with a better one."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

from grpo.errors import ConfigError

BEST_DIR = "best"
MODES = ("max", "min")


def better(value: float, than: float | None, *, mode: str) -> bool:
    """Whether ``value`` beats the best so far (``than``; None: nothing yet); NaN never does."""
    if math.isnan(value):
        return False
    return than is None or (value > than if mode == "max" else value < than)


class BestCheckpoint:
    """Tracks the best value of ``metric`` over the evaluations; ``metric`` '' keeps nothing."""

    def __init__(self, metric: str, *, mode: str = "max"):
        if mode not in MODES:
            raise ConfigError(f"best_checkpoint_mode: {mode!r} is not valid; choose one of {list(MODES)}")
        self.metric, self.mode = metric, mode
        self.step: int | None = None
        self.value: float | None = None

    def offer(self, step: int, metrics: dict) -> bool:
        """Record an evaluation's metrics; True when it is the best so far (its weights to be kept).
        Metrics without an evaluation, or of an interrupted one, are not judged."""
        if not self.metric or not any(k.startswith("eval/") for k in metrics) or metrics.get("eval/interrupted"):
            return False
        if self.metric not in metrics:
            known = sorted(k for k in metrics if k.startswith("eval/"))
            raise ConfigError(f"best_checkpoint_metric: {self.metric!r} is not a metric of the evaluation; "
                              f"it logged {known}")
        value = float(metrics[self.metric])
        if not better(value, self.value, mode=self.mode):
            return False
        self.step, self.value = step, value
        return True

    def write(self, run_dir: Path, model, tokenizer, *, weights: dict | None = None, is_main: bool = True) -> Path:
        """The model's weights into ``run_dir/best`` (replaced atomically) with best.json."""
        final = Path(run_dir) / BEST_DIR
        if not is_main:
            return final
        tmp = Path(run_dir) / f".tmp-{BEST_DIR}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        model.save_pretrained(tmp, **({} if weights is None else {"state_dict": weights}))
        tokenizer.save_pretrained(tmp)
        (tmp / "best.json").write_text(json.dumps({"metric": self.metric, "mode": self.mode, "step": self.step,
                                                   "value": self.value}, indent=2))
        old = Path(run_dir) / f".old-{BEST_DIR}-{os.getpid()}"
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
        return final

    def state_dict(self) -> dict:
        return {"metric": self.metric, "mode": self.mode, "step": self.step, "value": self.value}

    def load_state_dict(self, state: dict) -> None:
        if state.get("metric") == self.metric and state.get("mode") == self.mode:
            self.step, self.value = state["step"], state["value"]
