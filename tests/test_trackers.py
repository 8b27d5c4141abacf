"""report_to with the real trackers installed here: TensorBoard, W&B (offline), Trackio (local SQLite) and
MLflow (local file store) each get the run's metrics, read back through the tracker's own storage: the
same values at the same steps as metrics.jsonl. A tracker that raises mid-run is dropped with a warning
and the run finishes."""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from grpo.infra.trackers import mlflow_key, numeric, run_id

ROOT = Path(__file__).resolve().parents[1]


def _tracker_env(tmp: Path) -> dict:
    return {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "TRACKIO_DIR": str(tmp / "trackio"),
            "MLFLOW_TRACKING_URI": f"file:{tmp / 'mlruns'}", "MLFLOW_ALLOW_FILE_STORE": "true"}


def _wandb_history(run_dir: Path) -> tuple[dict[int, dict], dict]:
    """The history records and the config of the run's offline W&B transaction log (wandb's LevelDB-style
    log of protobuf Records: a 7-byte file header, then 32 KiB blocks of records with 7-byte headers)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (log,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data, pos, block, part, out, config = log.read_bytes(), 7, 32768, b"", {}, {}
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        part, pos = part + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(part)
            part = b""
            kind = record.WhichOneof("record_type")
            if kind in ("run", "config"):
                config.update({i.key: json.loads(i.value_json) for i in getattr(record, kind).config.update}
                              if kind == "run" else {i.key: json.loads(i.value_json) for i in record.config.update})
            if kind == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                out[record.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
    return out, config


def _mlflow_history(tmp: Path, run_dir: Path, keys) -> dict[int, dict]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"file:{tmp / 'mlruns'}")
    exp = client.get_experiment_by_name("grpo")
    (run,) = client.search_runs([exp.experiment_id], filter_string=f"tags.`grpo.run_id` = '{run_id(run_dir)}'")
    assert run.data.params["learning_rate"] == "0.001" and run.data.params["model"] != ""
    out: dict[int, dict] = {}
    for key in keys:  # under MLflow's names (eval/pass@k as eval/pass_at_k), read back as grpo's
        for m in client.get_metric_history(run.info.run_id, mlflow_key(key)):
            out.setdefault(m.step, {})[key] = m.value
    return out


def _trackio_history(tmp: Path, run_dir: Path) -> dict[int, dict]:
    code = ("import json, sys, trackio\n"
            "from trackio.sqlite_storage import SQLiteStorage\n"
            "run = [r for r in trackio.Api().runs('grpo') if r.name == sys.argv[1]][0]\n"
            "print(json.dumps({'logs': SQLiteStorage.get_logs('grpo', run.name), 'config': run.config}))")
    name = f"{run_dir.name}-{run_id(run_dir)[:8]}"
    proc = subprocess.run([sys.executable, "-c", code, name], env={**os.environ, **_tracker_env(tmp)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["config"]["learning_rate"] == 0.001
    return {row["step"]: {k: v for k, v in row.items() if k not in ("step", "timestamp")} for row in got["logs"]}


def test_every_tracker_gets_the_same_metrics_at_the_same_steps(tmp_path, tiny_model_dir, tiny_dataset, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "grpo", "train", f"model={tiny_model_dir}", f"task={tiny_dataset}", f"output_dir={run}",
         "max_steps=2", "prompts_per_step=2", "num_generations=2", "max_completion_length=6", "eval_prompts=2",
         "eval_steps=2", "eval_pass_k=2", "eval_pass_prompts=2", "eval_max_new_tokens=4",
         "learning_rate=1e-3", "progress=false", "bf16=false", "report_to=tensorboard,wandb,trackio,mlflow"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **_tracker_env(tmp_path)}, capture_output=True,
        text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = {m["step"]: numeric(m) for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    lines = {s: {k: v for k, v in m.items() if k != "step"} for s, m in lines.items()}
    assert sorted(lines) == [1, 2] and {"reward_mean", "loss", "grad_norm"} <= set(lines[1])
    assert "eval/pass@k" in lines[2]  # a name outside MLflow's alphabet
    keys = set().union(*lines.values())

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads a file store only when allowed
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    board = {}
    for key in acc.Tags()["scalars"]:
        for e in acc.Scalars(key):
            board.setdefault(e.step, {})[key] = e.value
    wandb_history, wandb_config = _wandb_history(run)
    assert wandb_config["learning_rate"] == 0.001 and wandb_config["report_to"] == "tensorboard,wandb,trackio,mlflow"
    histories = {"tensorboard": board, "wandb": wandb_history, "mlflow": _mlflow_history(tmp_path, run, keys),
                 "trackio": _trackio_history(tmp_path, run)}
    for name, got in histories.items():
        assert sorted(got) == [1, 2], (name, sorted(got))
        for step, want in lines.items():
            assert set(got[step]) == set(want), (name, step, set(want) ^ set(got[step]))
            for k, v in want.items():  # TensorBoard keeps float32
                assert math.isclose(got[step][k], v, rel_tol=1e-6 if name == "tensorboard" else 1e-12,
                                    abs_tol=1e-7 if name == "tensorboard" else 0.0), (name, step, k, got[step][k], v)


def test_a_tracker_that_raises_mid_run_is_dropped_with_a_warning_and_the_run_finishes(
        tmp_path, tiny_model_dir, tiny_dataset, monkeypatch, capsys):
    from mlflow.tracking import MlflowClient

    from grpo.train.trainer import Trainer
    from tests.test_trainer import make_cfg

    for k, v in _tracker_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    real, calls = MlflowClient.log_batch, []

    def flaky(self, run_id, metrics=(), params=(), tags=()):
        calls.append([m.step for m in metrics])
        if any(m.step == 2 for m in metrics):
            raise ConnectionError("tracking server gone")
        return real(self, run_id, metrics=metrics, params=params, tags=tags)

    monkeypatch.setattr(MlflowClient, "log_batch", flaky)
    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, eval_prompts=0, max_steps=3, report_to="mlflow,tensorboard")
    t = Trainer(cfg)
    t.train()
    out = capsys.readouterr().out
    assert "report_to: mlflow failed at step 2 (ConnectionError: tracking server gone); it gets no more" in out, out
    assert [s for c in calls for s in set(c)] == [1, 2]  # after its failure the tracker was not called again
    assert len((t.run_dir / "metrics.jsonl").read_text().splitlines()) == 3
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(t.run_dir / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("reward_mean")] == [1, 2, 3]  # the other tracker got every step


@pytest.mark.parametrize("value,error", [
    ("tensorboard,bogus", "report_to: 'tensorboard,bogus' is not valid; a comma list of tensorboard, wandb, trackio"),
    ("wandb,wandb", "(each once)"),
])
def test_report_to_names_the_trackers_it_takes(value, error):
    from grpo.config.fields import Config
    from grpo.config.validate import validate
    from grpo.errors import ConfigError

    with pytest.raises(ConfigError, match=None) as e:
        validate(Config(report_to=value))
    assert error in str(e.value)


def test_a_tracker_whose_package_is_missing_is_named_with_its_extra(monkeypatch):
    import importlib.util

    from grpo.config.fields import Config
    from grpo.config.validate import validate
    from grpo.errors import ConfigError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trackio" else real(name, *a))
    with pytest.raises(ConfigError) as e:
        validate(Config(report_to="tensorboard,trackio"))
    assert "report_to: trackio needs the trackio package, which is not installed (pip install 'grpo[trackio]')" \
        in str(e.value)
