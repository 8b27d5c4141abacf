"""grpo sft runs that continue and spread: a run stopped at step k (killed after its checkpoint, its later
metrics lines left behind; or stopped by a signal) and resumed equals the uninterrupted run, weights
bit for bit and metrics line for line (on two processes too, with dropout); two processes under
torchrun (DDP, gloo) give the weights and metrics of one process on the same global batches. Real `grpo sft` runs on the tiny random Llama."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.test_distributed import _weights  # a checkpoint step's weights, as the grpo train runs read them
from tests.test_sft_packing import CHATS

ROOT = Path(__file__).resolve().parents[1]
CLOCK = ("step_seconds",)  # the only metric that is not a function of the data and the weights


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sft-data") / "rows.jsonl"
    rows = CHATS + [{"prompt": f"What is {a} + {a}?", "completion": str(2 * a)} for a in range(2, 4)]  # 7 rows
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _args(model_dir, data_file, run_dir, extra=()) -> list[str]:
    return ["sft", f"model={model_dir}", f"sft_data={data_file}", f"output_dir={run_dir}", "sft_epochs=2",
            "sft_batch_size=3", "per_device_train_batch_size=2", "learning_rate=3e-3", "lr_scheduler_type=linear",
            "warmup_steps=1", "weight_decay=0.01", "save_steps=2", "seed=5", "bf16=false", "progress=false",
            "report_to=none", *extra]


def _metrics(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(x).items() if k not in CLOCK}
            for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _assert_bit_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _died_after_step_2(whole: Path, died: Path, metrics) -> Path:
    """A copy of the 6-step run ``whole`` as a run killed after step 2's checkpoint would leave it: later
    checkpoints, final/ and sft.json gone, metrics.jsonl rewritten by ``metrics`` from its lines."""
    shutil.copytree(whole, died)
    for leftover in ("checkpoints/step-4", "checkpoints/step-6", "final", "sft.json"):
        shutil.rmtree(died / leftover) if (died / leftover).is_dir() else (died / leftover).unlink()
    (died / "checkpoints" / "latest").write_text("step-2\n")
    (died / "metrics.jsonl").write_text(metrics((died / "metrics.jsonl").read_text().splitlines()))
    return died


@pytest.mark.parametrize("extra", [[], ["use_peft=true", "lora_r=4", "lora_dropout=0.2", "sft_packing=true"]],
                         ids=["full", "lora-dropout-packed"])
def test_resume_equals_the_uninterrupted_run(tmp_path, tiny_model_dir, data_file, extra):
    from grpo.cli import main
    from grpo.config.io import load_config
    from grpo.cli import _sft_model_settings, _sft_settings
    from grpo.sft import SFTRun

    steps = 6  # 7 rows in batches of 3: 3 steps an epoch (the last of 1 row)
    whole = tmp_path / "whole"
    assert main(_args(tiny_model_dir, data_file, whole, extra)) == 0
    assert [m["step"] for m in _metrics(whole)] == list(range(1, steps + 1))

    # killed after step 4's metrics line was written and before its checkpoint: the latest is step 2
    died = _died_after_step_2(whole, tmp_path / "died", lambda lines: "\n".join(lines[:4]) + "\n" + lines[4][:20])
    assert main(_args(tiny_model_dir, data_file, died, [*extra, "resume_from_checkpoint=auto"])) == 0
    assert _metrics(died) == _metrics(whole)
    _assert_bit_equal(_weights(died, steps), _weights(whole, steps))

    # stopped by a signal after step 1: a checkpoint, no final folder; --resume finishes it
    stopped = tmp_path / "stopped"
    cfg = load_config(None, _args(tiny_model_dir, data_file, stopped, extra)[1:])
    stopped.mkdir()
    cfg.save(stopped / "config.yaml")
    run = SFTRun(_sft_model_settings(cfg), _sft_settings(cfg, stopped), note=lambda *a: None)
    run.stop.signal = "SIGTERM"
    result = run.train()
    assert result["interrupted"] == "SIGTERM" and result["step"] == 1 and not (stopped / "sft.json").exists()
    assert main(["sft", "--resume", str(stopped)]) == 0
    assert _metrics(stopped) == _metrics(whole)
    _assert_bit_equal(_weights(stopped, steps), _weights(whole, steps))
    assert (stopped / "final" / "config.json").is_file()


def test_resume_under_another_batch_size_is_refused(tmp_path, tiny_model_dir, data_file, capsys):
    from grpo.cli import main

    run = tmp_path / "run"
    assert main(_args(tiny_model_dir, data_file, run, ["sft_epochs=0.5"])) == 0
    assert main(["sft", "--resume", str(run), "sft_batch_size=2"]) == 2
    assert "sft_batch_size: the run started with 3, this config has 2" in capsys.readouterr().err
    assert main(_args(tiny_model_dir, data_file, run)) == 2  # a fresh run never writes into a run's folder
    assert "grpo sft --resume" in capsys.readouterr().err


def _sft(run_dir: Path, model_dir, data_file, *, procs: int, extra=()) -> Path:
    """`grpo sft` in a subprocess on ``procs`` processes (torchrun for two), gloo on the CPU."""
    launcher = [sys.executable, "-m", "grpo.cli"] if procs == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs), "-m", "grpo.cli"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run(launcher + _args(model_dir, data_file, run_dir, ["num_threads=1", "sft_epochs=1", *extra]),
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return run_dir


@pytest.mark.parametrize("extra", [[], ["sft_packing=true"]], ids=["padded", "packed"])
def test_two_processes_equal_one(tmp_path, tiny_model_dir, data_file, extra):
    """Batches of 3 rows over 2 processes: shares of 2 and 1 rows, and the last batch's single row
    leaves one process without a row (it joins the all-reduce with weight 0)."""
    one = _sft(tmp_path / "one", tiny_model_dir, data_file, procs=1, extra=extra)
    two = _sft(tmp_path / "two", tiny_model_dir, data_file, procs=2, extra=extra)
    m1, m2 = _metrics(one), _metrics(two)
    assert [m["step"] for m in m1] == [m["step"] for m in m2] == [1, 2, 3]
    for a, b in zip(m1, m2):
        for k in ("loss", "grad_norm", "learning_rate", "trained_tokens", "epoch"):
            assert a[k] == pytest.approx(b[k], rel=1e-5), (a["step"], k, a[k], b[k])
    w1, w2 = _weights(one, 3), _weights(two, 3)
    initial = load_file(str(next(Path(tiny_model_dir).glob("*.safetensors"))))
    moved = max(float((w1[k] - initial[k]).abs().max()) for k in w1 if k in initial)
    worst = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    # float sums in another order (shares all-reduced vs one sum), and Adam divides each gradient by its
    # own scale, so a small element's rounding shows in its step: bound by the movement, as in
    # test_distributed (a wrongly weighted share moves weights by the order of the movement itself)
    assert moved > 1e-3 and worst <= 0.01 * moved, (moved, worst)
    assert (two / "final" / "config.json").is_file() and (two / "sft.json").is_file()


def test_two_process_resume_equals_the_uninterrupted_run(tmp_path, tiny_model_dir, data_file):
    """Two processes with LoRA dropout: each process draws its own dropout masks, so a resumed run equals
    the uninterrupted one only when every process gets its own random state back (rank 1 given rank
    0's would draw rank 0's masks)."""
    extra = ["use_peft=true", "lora_r=4", "lora_dropout=0.3", "sft_epochs=2"]
    whole = _sft(tmp_path / "whole", tiny_model_dir, data_file, procs=2, extra=extra)
    assert [m["step"] for m in _metrics(whole)] == list(range(1, 7))
    died = _died_after_step_2(whole, tmp_path / "died", lambda lines: "\n".join(lines[:2]) + "\n")
    _sft(died, tiny_model_dir, data_file, procs=2, extra=[*extra, "resume_from_checkpoint=auto"])
    assert _metrics(died) == _metrics(whole)
    _assert_bit_equal(_weights(died, 6), _weights(whole, 6))
