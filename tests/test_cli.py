"""The `grpo` command: errors name the key before any model loads; eval and train run end to end."""

from __future__ import annotations

import json
import os
import shutil
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
    assert ("aggregation: 'sum' is not valid; choose one of ['seq_mean_token_mean', 'seq_mean_token_sum', "
            "'seq_mean_token_sum_norm', 'token_mean']") in capsys.readouterr().err


def test_unknown_reward_is_one_line_error(capsys, tiny_dataset, tmp_path):
    """Rewards are resolved before the model loads; an unknown one is an error naming the key."""
    assert main(["train", "model=./no/such/model", f"task={tiny_dataset}", "rewards=nosuch",
                 f"output_dir={tmp_path / 'r'}"]) == 2
    err = capsys.readouterr().err
    assert "rewards: unknown reward 'nosuch'" in err and "numeric" in err and "Traceback" not in err


def test_missing_model_path_is_one_line_error(capsys, tiny_dataset, tmp_path):
    code = main(["train", "model=./no/such/model", f"task={tiny_dataset}", f"output_dir={tmp_path / 'r'}",
                 "eval_prompts=0"])
    err = capsys.readouterr().err
    assert code == 2 and ("model ./no/such/model: no such folder (read as a local path, as it starts with .; not "
                          "looked up as a hub id)") in err
    assert not (tmp_path / "r").exists()  # refused before the run folder is made
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
    assert "eval_prompts_requested" not in res  # the run's own held-out prompts: nothing left out
    # more prompts than the run held out: the 6 beyond its 4 are training prompts, left out and said so
    assert main(["eval", "--model", str(run), "eval_prompts=10"]) == 0
    captured = capsys.readouterr()
    wider = json.loads(captured.out)
    assert wider["n_prompts"] == wider["prompts_scored"] == 4 and wider["accuracy"] == after["accuracy"]
    assert wider["eval_prompts_requested"] == 10 and wider["training_prompts_left_out"] == 6
    assert (f"grpo eval: 6 of the 10 prompts asked for (eval_prompts=10) are prompts {run} trained on: they are "
            "left out, 4 held-out prompts are evaluated") in captured.err
    # the run can be extended exactly where it stopped
    assert main(["train", "--resume", str(run), "max_steps=3"]) == 0
    assert [json.loads(l)["step"] for l in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


def test_toy_prints_table(capsys):
    from grpo.commands.toy import ESTIMATORS, PUBLISHED

    assert main(["toy"]) == 0  # seed 002's setup on its own seed
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.split()[:1] == ["3"])  # seed 3's rates
    assert [float(x) for x in row[1:]] == pytest.approx([PUBLISHED[e] for e in ESTIMATORS], abs=0.01)
    assert "prompt 0 P(bit = 1), seed 3: [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]" in out


def test_help_lists_config_keys_by_section(capsys):
    with pytest.raises(SystemExit) as done:
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "num_generations" in out and "(default: 8)" in out
    assert out.index("Model and data [model]") < out.index("Rewards [rewards]") < out.index("Hardware and distributed")
    with pytest.raises(SystemExit) as done:
        main(["train", "--help", "rewards"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and out.startswith("Rewards [rewards]")
    assert "reward_timeout" in out and "num_generations" not in out
    with pytest.raises(SystemExit) as done:
        main(["eval", "--help", "rewardz"])
    assert done.value.code == 2 and "no config section 'rewardz'; sections: model, sampling" in capsys.readouterr().err


def test_code_reward_without_a_sandbox_stops_before_model_load(capsys, tmp_path, monkeypatch):
    """task=code brings its own reward, code, whose sandbox check runs before the model loads."""
    from grpo.rewards import code

    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap to be found
    monkeypatch.delitem(code.GRADERS, "default", raising=False)
    assert main(["train", "model=./no/such/model", "task=code", f"output_dir={tmp_path / 'r'}"]) == 2
    err = capsys.readouterr().err
    assert "bubblewrap" in err and "apt-get install" in err and "no/such/model" not in err


def _train_args(run, tiny_model_dir, tiny_dataset, *extra) -> list[str]:
    return ["train", f"model={tiny_model_dir}", f"task={tiny_dataset}", f"output_dir={run}", "num_generations=4",
            "prompts_per_step=2", "per_device_train_batch_size=4", "max_completion_length=6", "eval_prompts=2",
            "eval_max_new_tokens=4", "eval_pass_k=0", "progress=false", "report_to=none", "log_completions_steps=1",
            "rewards=tests.rewards_for_tests:digit_share", f"bf16={TEST_BF16}", f"seed={TEST_SEED}", *extra]


_CLOCK = ("seconds", "per_second", "measured_on")  # wall-clock metrics and the time stamp: what a repeat may change


def _no_clock(value):
    """``value`` (parsed JSON) without its wall-clock entries, at any depth."""
    if isinstance(value, dict):
        return {k: _no_clock(v) for k, v in value.items() if not any(c in k for c in _CLOCK)}
    if isinstance(value, list):
        return [_no_clock(v) for v in value]
    return value


def test_config_yaml_repeats_the_run(capsys, tmp_path, tiny_model_dir, tiny_dataset):
    """docs/guides/runs.md: `grpo train --config runs/X/config.yaml output_dir=runs/Y` repeats the run: the same
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


def test_sigterm_during_the_evaluation_of_a_run_stops_it_and_keeps_what_it_scored(tmp_path, tiny_model_dir):
    """`grpo train` (the real command, in its own process) sent SIGTERM while it evaluates 300 held-out
    prompts in batches of 10 stops that evaluation at the next batch (or token), saves its checkpoint
    and exits 143, with eval.json's "before" marked interrupted and holding fewer prompts than asked
    for, instead of evaluating all 300 first."""
    run, log = tmp_path / "run", tmp_path / "stdout.txt"
    args = ["train", f"model={tiny_model_dir}", "task=arithmetic", f"output_dir={run}", "eval_prompts=300",
            "eval_batch_size=10", "eval_max_new_tokens=32", "eval_pass_k=0", "num_generations=4",
            "prompts_per_step=2", "per_device_train_batch_size=4", "max_completion_length=6", "max_steps=5",
            "progress=false", "report_to=none", "rewards=tests.rewards_for_tests:digit_share", f"bf16={TEST_BF16}"]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "grpo", *args], env=env, stdout=out, stderr=subprocess.PIPE,
                                text=True)
        deadline = time.monotonic() + 300  # a hang fails here, not at the suite timeout
        while proc.poll() is None and time.monotonic() < deadline and "evaluating the untrained" not in log.read_text():
            time.sleep(0.05)
        assert proc.poll() is None, f"the run ended before its evaluation: {proc.stderr.read()}"
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert rc == 143, proc.stderr.read()
    before = json.loads((run / "eval.json").read_text())["before"]
    assert before["interrupted"] is True and before["n_prompts"] == 300 and before["prompts_scored"] < 300
    assert before["prompts_scored"] % 10 == 0  # whole batches only: a batch cut by the signal is dropped
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-0"
    assert "evaluation at step 0 interrupted" in log.read_text()


def test_sigterm_during_grpo_eval_prints_the_partial_result_marked(capsys, tmp_path, tiny_model_dir, tiny_dataset):
    """`grpo eval` stopped by SIGTERM (sent by the verifier on its first call) prints what it scored,
    marked interrupted, and exits 143; its signal handlers are restored."""
    from tests import rewards_for_tests as r

    caught: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: caught.append(signum))  # what grpo eval
    # must restore; where it did not handle the signal itself, this records it instead of ending pytest
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    r.counted.update(n=0, fail_from=0, sigterm_at=1)
    try:
        code = main(["eval", "--model", str(tiny_model_dir), f"task={tiny_dataset}", "eval_prompts=8",
                     "eval_batch_size=2", "eval_max_new_tokens=4", "eval_pass_k=2", "eval_pass_prompts=4",
                     "rewards=tests.rewards_for_tests:counting"])
        assert {s: signal.getsignal(s) for s in handlers} == handlers
    finally:
        r.counted.update(sigterm_at=0)
        signal.signal(signal.SIGTERM, previous)
    res = json.loads(capsys.readouterr().out)
    assert code == 143 and res["interrupted"] is True and res["prompts_scored"] == 2 and res["n_prompts"] == 8
    assert res["pass@k"] is None and r.counted["n"] == 2 and caught == []


class _NoSuchModelHub:
    """A stand-in for the hub on loopback (a real HTTP server in a thread): every request is answered
    404 RepoNotFound, as the hub answers for a model it does not have, and recorded."""

    def __init__(self):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        requests = self.requests = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                requests.append(self.path)
                body = b'{"error": "Repository not found"}'
                self.send_response(404)
                self.send_header("X-Error-Code", "RepoNotFound")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_HEAD = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


# Each command in one process (the CLI's main, as `python -m grpo` runs it), its stderr captured: the
# hub's endpoint and offline mode are read from the environment when huggingface_hub is imported.
_COMMANDS = r"""
import contextlib, io, json, os, sys
from pathlib import Path
from grpo.cli import main
out = {}
for name, argv in json.loads(sys.argv[1]).items():
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    out[name] = [code, [l for l in err.getvalue().splitlines() if "error" in l.lower()], Path("r").exists()]
print(json.dumps(out))
"""


def _run_commands(cwd, commands: dict, **env) -> dict:
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "HF_HOME": str(cwd / "hf-home"), **env}
    proc = subprocess.run([sys.executable, "-c", _COMMANDS, json.dumps(commands)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def _every_command(model: str) -> dict:
    return {"train": ["train", f"model={model}", "output_dir=r", "eval_prompts=0"],
            "eval": ["eval", "--model", model, "eval_prompts=2"],
            "export": ["export", model, "--out", "exported"],
            "serve": ["serve", model]}


def test_a_missing_path_whose_first_part_is_a_folder_here_is_local_at_once(tmp_path):
    """`grpo export runs/nonexistent` (the real command) where runs/ exists: a one-line error that it
    is no such folder, read as a local path, and not one request to the hub; so for train, eval,
    export and serve alike (train writes no run folder)."""
    (tmp_path / "runs").mkdir()
    hub = _NoSuchModelHub()
    try:
        env = {**os.environ, "PYTHONPATH": os.getcwd(), "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf-home")}
        proc = subprocess.run([sys.executable, "-m", "grpo", "export", "runs/nonexistent", "--out", "exported"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        got = _run_commands(tmp_path, _every_command("runs/nonexistent"), HF_ENDPOINT=hub.url)
    finally:
        hub.close()
    reading = ("model runs/nonexistent: no such folder (read as a local path, as runs/ is a folder here; not looked "
               "up as a hub id)")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == f"grpo export: error: {reading}"
    assert "Traceback" not in proc.stderr and len([l for l in proc.stderr.splitlines() if "error" in l]) == 1
    assert got == {cmd: [2, [f"grpo {cmd}: error: {reading}"], False] for cmd in ("train", "eval", "export", "serve")}
    assert [p for p in hub.requests if "nonexistent" in p] == []


def test_a_model_neither_here_nor_on_the_hub_is_one_request_and_one_line(tmp_path):
    """A hub id that is no local path and that the hub does not have: one request to the hub (no
    retries), then a one-line error naming both readings, for train, eval, export and serve; with
    HF_HUB_OFFLINE the hub is not asked at all and the error says the cache does not hold it."""
    hub = _NoSuchModelHub()
    try:
        got = _run_commands(tmp_path, _every_command("nobody/no-such-model"), HF_ENDPOINT=hub.url)
        asked = list(hub.requests)
        hub.requests.clear()
        offline = _run_commands(tmp_path, {"export": ["export", "nobody/no-such-model", "--out", "exported"]},
                                HF_ENDPOINT=hub.url, HF_HUB_OFFLINE="1")
    finally:
        hub.close()
    neither = "model nobody/no-such-model: not a local folder (no such path here) and"
    assert got == {cmd: [2, [f"grpo {cmd}: error: {neither} not a model on the hub ({hub.url}: no such repository, "
                             "or a private one without a token)"], False] for cmd in ("train", "eval", "export", "serve")}
    # one request about the model per command (huggingface_hub may ask its own things, as /api/agent-harnesses)
    assert [p for p in asked if "no-such-model" in p] == ["/api/models/nobody/no-such-model"] * 4
    assert offline == {"export": [2, [f"grpo export: error: {neither} not in the hub cache (HF_HUB_OFFLINE is set, "
                                      "so the hub is not asked)"], False]}
    assert [p for p in hub.requests if "no-such-model" in p] == []


def test_a_cached_hub_model_loads_from_the_cache_when_the_hub_cannot_be_reached(tmp_path, tiny_model_dir, monkeypatch):
    """A hub id whose snapshot the hub cache holds resolves to that snapshot when the hub cannot be
    reached (a refused connection), at once; one it does not hold is a one-line error saying both."""
    import socket

    import huggingface_hub.constants as hub_constants

    from grpo.errors import ModelNotFoundError
    from grpo.models.loading import resolve_model_path

    cache = tmp_path / "hub"
    snapshot = cache / "models--someone--tiny" / "snapshots" / ("0" * 40)
    shutil.copytree(tiny_model_dir, snapshot)
    (cache / "models--someone--tiny" / "refs").mkdir()
    (cache / "models--someone--tiny" / "refs" / "main").write_text("0" * 40)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub_constants, "ENDPOINT", closed)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    assert resolve_model_path("someone/tiny") == str(snapshot)
    with pytest.raises(ModelNotFoundError, match=r"^model someone/other: not a local folder \(no such path here\) and "
                                                 rf"the hub \({closed}\) cannot be reached \(ConnectError: .*\) and its "
                                                 r"cache does not hold it$"):
        resolve_model_path("someone/other")


def test_commands_are_a_registry_an_unknown_one_lists_them(capsys):
    """`grpo --help` prints every registered command; an unknown command or control subcommand
    exits 2 naming the valid ones."""
    from grpo.cli import COMMANDS

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in COMMANDS) and len(COMMANDS) == 14
    assert main(["nope"]) == 2
    assert "unknown command 'nope'; valid: train, sft, eval, prm, data, audit, compare, report, toy, control, export" in capsys.readouterr().err
    assert main(["control", "nope"]) == 2
    assert "unknown control command 'nope'; valid: train, compare" in capsys.readouterr().err


def test_grpo_eval_samples_with_the_engine_evaluation_in_training_uses(tiny_model_dir, tiny_dataset, capsys):
    """A run whose rollout engine serves evaluation (vLLM's) is evaluated by `grpo eval` on that engine, as
    inside `grpo train`, or where that engine is a server shared with other runs, on its standalone one;
    any other on generate (hf). A registered engine that serves evaluation records that it sampled."""
    from grpo.rollout import ROLLOUT_ENGINES, HFEngine

    used = []

    class Recording(HFEngine):
        name = "recording_eval"
        serves_evaluation = True

        def generate(self, *args, **kwargs):
            used.append(kwargs.get("greedy"))
            return super().generate(*args, **kwargs)

    class Shared(HFEngine):  # a server other runs sample from: grpo eval must not push weights into it
        name = "recording_shared"
        serves_evaluation = True
        standalone = "recording_eval"

        def __init__(self, *args, **kwargs):
            raise AssertionError("grpo eval built the shared engine")

    ROLLOUT_ENGINES.register(Recording)
    ROLLOUT_ENGINES.register(Shared)
    try:
        args = ["eval", "--model", str(tiny_model_dir), f"task={tiny_dataset}", "eval_prompts=2", "eval_pass_k=0",
                "eval_max_new_tokens=2"]
        assert main([*args, "rollout_engine=recording_eval"]) == 0
        assert used and all(used)  # the greedy evaluation ran on the run's engine
        used.clear()
        assert main([*args, "rollout_engine=recording_shared"]) == 0 and used and all(used)  # on its standalone one
        used.clear()
        assert main([*args, "rollout_engine=hf"]) == 0 and used == []
    finally:
        ROLLOUT_ENGINES.unregister("recording_eval")
        ROLLOUT_ENGINES.unregister("recording_shared")
    capsys.readouterr()
