"""What a new user meets first: defaults that follow the run, a refused resume that changes nothing,
epochs as TRL scripts give them, a mixture's summary, and output that never looks broken."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo.cli import main
from grpo.config import Config
from tests.conftest import TEST_BF16, TEST_SEED

ROOT = Path(__file__).resolve().parents[1]
# a line of stderr that would make a finished run look broken: a failure, a trust setting, a warning
ALARMING = ("fail", "error", "trust", "warning", "traceback", "deprecat")


def _common(tmp_path, **kw) -> list[str]:
    base = {"num_generations": 2, "prompts_per_step": 4, "max_completion_length": 4, "eval_pass_k": 0,
            "report_to": "none", "bf16": str(TEST_BF16).lower(), "seed": TEST_SEED, "reward_timeout": 0,
            "rewards": "tests.rewards_for_tests:digit_share", "output_dir": str(tmp_path / "run")}
    base.update(kw)
    return [f"{k}={v}" for k, v in base.items()]


def _rows(path: Path, n: int, offset: int = 0) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"What is {i} + {offset}?", "answer": str(i + offset)}) + "\n"
                            for i in range(n)))
    return path


def test_the_evaluation_gets_the_room_training_gets(tmp_path):
    """A tool task on the user's own data with max_completion_length=64 and no eval_max_new_tokens: its
    held-out episodes get 64 tokens, as its training episodes do (not 32, cut after the tool's result)."""
    from grpo.train.settings import eval_settings

    data = _rows(tmp_path / "mine.jsonl", 20)
    tool_run = Config(task=str(data), tools="builtin:calculator", max_completion_length=64)
    assert eval_settings(tool_run).sampling.max_new_tokens == 64
    assert Config(max_completion_length=64).eval_max_new_tokens == 64
    assert Config(max_completion_length=64, eval_max_new_tokens=16).eval_max_new_tokens == 16
    assert Config().eval_max_new_tokens == Config().max_completion_length
    assert Config(task="calculator").eval_max_new_tokens == 64  # the task's preset length
    assert Config(task="arithmetic:0.5,calculator:0.5").eval_max_new_tokens == 64  # the largest a source asks


def test_num_train_epochs_runs_the_steps_of_one_pass(tmp_path, tiny_model_dir):
    """40 rows, none held out, 8 prompts a step: one epoch is 5 steps, recorded as the run's max_steps."""
    data = _rows(tmp_path / "forty.jsonl", 40)
    assert main(["train", f"model={tiny_model_dir}", f"task={data}", "eval_prompts=0", "num_train_epochs=1",
                 *_common(tmp_path, prompts_per_step=8, progress="false")]) == 0
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5]
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert "max_steps: 5\n" in saved and "num_train_epochs: null\n" in saved  # a resume's max_steps=N then counts


def test_a_refused_resume_leaves_the_config_and_names_the_key(tmp_path, tiny_model_dir, tiny_dataset, capsys):
    assert main(["train", f"model={tiny_model_dir}", f"task={tiny_dataset}", "max_steps=1", "eval_prompts=4",
                 *_common(tmp_path, progress="false")]) == 0
    run = tmp_path / "run"
    before = (run / "config.yaml").read_bytes()
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "eval_prompts=0", "max_steps=2"]) == 2
    err = capsys.readouterr().err
    assert "eval_prompts: cannot change on resume (eval_prompts was 4, now 0" in err
    assert "Resume without changing it" in err and "sampler state" not in err
    assert (run / "config.yaml").read_bytes() == before
    assert main(["train", "--resume", str(run), "max_steps=2"]) == 0  # the plain resume still works
    assert "max_steps: 2\n" in (run / "config.yaml").read_text()


def test_a_mixture_of_two_files_with_evaluation_ends_with_its_summary(tmp_path, tiny_model_dir, capsys):
    a, b = _rows(tmp_path / "a.jsonl", 20), _rows(tmp_path / "b.jsonl", 20, offset=5)
    assert main(["train", f"model={tiny_model_dir}", f"task={a}:0.5,{b}:0.5", "max_steps=1", "eval_prompts=8",
                 *_common(tmp_path, progress="false", eval_pass_k=2, eval_pass_prompts=2)]) == 0
    out = capsys.readouterr().out
    assert "held-out greedy accuracy on 16 prompts" in out and "pass@2 on 4 prompts" in out
    assert "greedy answers cut at eval_max_new_tokens=4" in out


def test_a_non_terminal_gets_whole_progress_lines(tmp_path, tiny_model_dir, tiny_dataset):
    """stdout to a pipe: one whole line per step (rich's bar would be cut to 80 columns mid-word)."""
    proc = subprocess.run([sys.executable, "-m", "grpo", "train", f"model={tiny_model_dir}", f"task={tiny_dataset}",
                           "max_steps=2", "eval_prompts=0", *_common(tmp_path)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "40"}, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == ["1/2", "2/2"]
    assert all("reward_mean=" in line and "step_seconds=" in line and line.endswith(")") for line in lines)


def test_grpo_train_with_no_arguments_writes_nothing_alarming_to_stderr(tmp_path, tiny_model_dir):
    """The default run's command (the tiny model standing in for the embedded one, one step): no line of
    stderr mentions a failure, a trust setting or a warning, whatever dependencies are installed."""
    proc = subprocess.run([sys.executable, "-m", "grpo", "train", f"model={tiny_model_dir}", "max_steps=1",
                           "eval_prompts=4", "num_generations=2", "max_completion_length=4", "report_to=none",
                           f"output_dir={tmp_path / 'run'}", f"bf16={str(TEST_BF16).lower()}"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    alarming = [line for line in proc.stderr.splitlines() if any(w in line.lower() for w in ALARMING)]
    assert not alarming, proc.stderr
    assert "\r" not in proc.stderr  # no progress bars of loading and saving weights either


def test_bitsandbytes_kernel_fetch_warning_is_held_back_until_qlora_asks(caplog):
    """On CPUs with AVX512-BF16, importing bitsandbytes (peft does, QLoRA or not) logs a failed kernel
    fetch: held back for every CPU alike (the record is logged here, not left to this CPU's import)."""
    import logging

    from grpo.infra.quiet import BITSANDBYTES_CPU, held_back, quiet_dependencies

    quiet_dependencies()
    message = "Failed to load CPU gemm_4bit_forward from kernels-community: set trust_remote_code=True (test)"
    with caplog.at_level(logging.WARNING):
        logging.getLogger(BITSANDBYTES_CPU).warning(message)
        logging.getLogger(BITSANDBYTES_CPU).warning("another warning of bitsandbytes (test)")
    assert [r.getMessage() for r in caplog.records] == ["another warning of bitsandbytes (test)"]  # no handler saw it
    assert message in held_back()
