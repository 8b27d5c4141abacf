"""The `grpo` command: errors name the key before any model loads; eval and train run end to end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from grpo.cli import main
from tests.conftest import TEST_BF16, TEST_SEED


def test_unknown_key_fails_before_model_load(capsys):
    assert main(["train", "model=/does/not/matter", "num_generation=4"]) == 2
    err = capsys.readouterr().err
    assert "num_generation" in err and "did you mean num_generations" in err


def test_bad_value_lists_choices(capsys):
    assert main(["train", "aggregation=sum"]) == 2
    assert ("aggregation: 'sum' is not valid; choose one of ['seq_mean_token_mean', 'seq_mean_token_sum_norm', "
            "'token_mean']") in capsys.readouterr().err


def test_unknown_reward_is_one_line_error(capsys, tiny_dataset, tmp_path):
    """Rewards are resolved before the model loads; an unknown one is an error naming the key."""
    assert main(["train", "model=./no/such/model", f"task={tiny_dataset}", "rewards=nosuch",
                 f"output_dir={tmp_path / 'r'}"]) == 2
    err = capsys.readouterr().err
    assert "rewards: unknown name 'nosuch'" in err and "numeric" in err and "Traceback" not in err


def test_missing_model_path_is_one_line_error(capsys, tiny_dataset, tmp_path):
    code = main(["train", "model=./no/such/model", f"task={tiny_dataset}", f"output_dir={tmp_path / 'r'}",
                 "eval_prompts=0"])
    err = capsys.readouterr().err
    assert code == 2 and "model path ./no/such/model does not exist" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("sub", ["", "inside"])
def test_output_dir_naming_a_file_is_one_line_error(capsys, tiny_dataset, tiny_model_dir, tmp_path, sub):
    """output_dir= an existing file (or a folder under one): a message naming the key, exit 2, no
    traceback, before the model loads; the file is left as it was."""
    existing = tmp_path / "notes.txt"
    existing.write_text("keep me")
    target = existing / sub if sub else existing
    code = main(["train", f"model={tiny_model_dir}", f"task={tiny_dataset}", f"output_dir={target}",
                 "eval_prompts=0"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("grpo train: error: output_dir: ") and str(target) in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert existing.read_text() == "keep me"


def test_dataset_row_error_names_row(capsys, tmp_path, tiny_model_dir):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b"}\n')
    assert main(["train", f"model={tiny_model_dir}", f"task={bad}", "eval_prompts=0",
                 f"output_dir={tmp_path / 'r'}"]) == 2
    assert "row 2 has no field 'answer'" in capsys.readouterr().err


def test_resume_without_run_folder(capsys, tmp_path):
    assert main(["train", "--resume", str(tmp_path / "nothing")]) == 2
    assert "no config.yaml" in capsys.readouterr().err


def test_train_then_eval_run_folder(capsys, tmp_path, tiny_model_dir, tiny_dataset):
    run = tmp_path / "run"
    args = ["train", f"model={tiny_model_dir}", f"task={tiny_dataset}", f"output_dir={run}", "max_steps=2",
            "num_generations=4", "prompts_per_step=2", "per_device_train_batch_size=4", "max_completion_length=6",
            "eval_prompts=4", "eval_max_new_tokens=4", "eval_pass_k=2", "eval_pass_prompts=2", "progress=false",
            "report_to=none", "rewards=tests.rewards_for_tests:digit_share", f"bf16={TEST_BF16}"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "held-out greedy accuracy on 4 prompts" in out and str(run) in out
    assert main(["eval", "--model", str(run)]) == 0
    res = json.loads(capsys.readouterr().out)
    after = json.loads((run / "eval.json").read_text())["after"]
    # the run folder evaluates its final checkpoint as training did (greedy: the same answers)
    assert res["n_prompts"] == 4 and res["accuracy"] == after["accuracy"]
    assert res["mean_length"] == after["mean_length"]
    assert res["k"] == 2 and res["pass_prompts"] == 2 and res["pass@k"] in (0.0, 0.5, 1.0)  # 2 prompts, n = k
    # the run can be extended exactly where it stopped
    assert main(["train", "--resume", str(run), "max_steps=3"]) == 0
    assert [json.loads(l)["step"] for l in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


def test_toy_prints_table(capsys):
    from grpo.tools.toy import ESTIMATORS, PUBLISHED

    assert main(["toy"]) == 0  # seed 002's setup on its own seed
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.split()[:1] == ["3"])  # seed 3's rates
    assert [float(x) for x in row[1:]] == pytest.approx([PUBLISHED[e] for e in ESTIMATORS], abs=0.01)
    assert "prompt 0 P(bit = 1), seed 3: [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]" in out


def test_help_lists_config_keys(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "num_generations" in capsys.readouterr().out


def test_code_reward_without_a_sandbox_stops_before_model_load(capsys, tmp_path, monkeypatch):
    from grpo.rewards import code

    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap to be found
    monkeypatch.setattr(code, "_default", None)
    assert main(["train", "model=./no/such/model", "task=code", "rewards=code", f"output_dir={tmp_path / 'r'}"]) == 2
    err = capsys.readouterr().err
    assert "bubblewrap" in err and "apt-get install" in err and "no/such/model" not in err


def _train_args(run, tiny_model_dir, tiny_dataset, *extra) -> list[str]:
    return ["train", f"model={tiny_model_dir}", f"task={tiny_dataset}", f"output_dir={run}", "num_generations=4",
            "prompts_per_step=2", "per_device_train_batch_size=4", "max_completion_length=6", "eval_prompts=2",
            "eval_max_new_tokens=4", "eval_pass_k=0", "progress=false", "report_to=none", "log_completions_steps=1",
            "rewards=tests.rewards_for_tests:digit_share", f"bf16={TEST_BF16}", f"seed={TEST_SEED}", *extra]


_CLOCK = ("seconds", "per_second")  # wall-clock metrics, the only ones a repeat may change


def _no_clock(value):
    """``value`` (parsed JSON) without its wall-clock entries, at any depth."""
    if isinstance(value, dict):
        return {k: _no_clock(v) for k, v in value.items() if not any(c in k for c in _CLOCK)}
    if isinstance(value, list):
        return [_no_clock(v) for v in value]
    return value


def test_config_yaml_repeats_the_run(capsys, tmp_path, tiny_model_dir, tiny_dataset):
    """README: `grpo train --config runs/X/config.yaml output_dir=runs/Y` repeats the run: the same
    metrics (all but the wall-clock ones), samples and evaluation, and the same resolved config but for
    the folder."""
    first, again = tmp_path / "x", tmp_path / "y"
    assert main(_train_args(first, tiny_model_dir, tiny_dataset, "max_steps=2")) == 0
    assert main(["train", "--config", str(first / "config.yaml"), f"output_dir={again}"]) == 0
    capsys.readouterr()

    def metrics(run):
        return [_no_clock(json.loads(l)) for l in (run / "metrics.jsonl").read_text().splitlines()]

    assert [m["step"] for m in metrics(first)] == [1, 2] and metrics(again) == metrics(first)
    assert (again / "samples.jsonl").read_text() == (first / "samples.jsonl").read_text()
    evaluation = lambda run: _no_clock(json.loads((run / "eval.json").read_text().replace(str(run), "RUN")))  # noqa: E731
    assert evaluation(again) == evaluation(first)
    config = lambda run: (run / "config.yaml").read_text().replace(str(run), "RUN")  # noqa: E731
    assert config(again) == config(first)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_signal_through_the_cli_saves_and_exits_with_its_code(tmp_path, tiny_model_dir, tiny_dataset, sig, code):
    """`grpo train` (the real command, in its own process) stopped by SIGINT or SIGTERM after its first
    logged step finishes the step, saves a checkpoint of the last finished step, skips the final
    evaluation and exits with 130 or 143 (128 + the signal), as shells and schedulers expect."""
    run = tmp_path / "run"
    args = _train_args(run, tiny_model_dir, tiny_dataset, "max_steps=200", "save_steps=1000")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen([sys.executable, "-m", "grpo", *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 300  # a hang fails here, not at the suite timeout
    while proc.poll() is None and time.monotonic() < deadline and not (metrics.exists() and metrics.read_text()):
        time.sleep(0.1)
    assert proc.poll() is None, f"the run ended before its first step was logged: {proc.stderr.read()}"
    proc.send_signal(sig)
    try:
        rc = proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert rc == code, proc.stderr.read()
    steps = [json.loads(l)["step"] for l in metrics.read_text().splitlines()]
    latest = (run / "checkpoints" / "latest").read_text().strip()
    assert steps and latest == f"step-{steps[-1]}" and steps[-1] < 200  # saved at the step it stopped after
    assert (run / "checkpoints" / latest / "model.safetensors").is_file()
    assert not (run / "eval.json").exists() or "after" not in json.loads((run / "eval.json").read_text())
