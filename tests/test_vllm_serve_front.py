"""`grpo vllm-serve`'s HTTP front and the trainer's client, without vLLM: the command runs as a
subprocess on a real tiny engine (tests/vllm_standin.py: a transformers model that samples, scores and
loads weights); everything in front of the engine (flags, key, limits, checks, signals) is the
server's own. Hostile requests get their status while the server keeps serving with its weights
unchanged; a server that stops answering (SIGSTOP, or a socket that accepts and never answers) ends
the run with a checkpoint and a one-line error naming the URL."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from tests.hostile import HangingServer, battery, flood, request

ROOT = Path(__file__).resolve().parents[1]
KEY = "test-key-7f3a"
GOOD = json.dumps({"prompts": [[5, 6, 7]], "params": [{"n": 1, "max_tokens": 2, "temperature": 1.0, "seed": 3,
                                                        "logprobs": 0, "stop_token_ids": [1]}]}).encode()
ROW = json.dumps({"rows": [[5, 6, 7, 8, 9]]}).encode()
LIMIT = 1 << 16


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_standin(model: Path, *args: str, key: str | None = KEY) -> subprocess.Popen:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GRPO_VLLM_API_KEY", None)
    if key:
        env["GRPO_VLLM_API_KEY"] = key
    proc = subprocess.Popen([sys.executable, "-m", "tests.vllm_standin", str(model), "--port", str(port), *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    proc.port = port
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if request(port, "GET", "/health", key=key).status == 200:
                return proc
        except OSError:
            time.sleep(0.2)
        assert proc.poll() is None, proc.stdout.read()
    raise AssertionError("the server did not start")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def served(tiny_model_dir, tmp_path_factory):
    weights = tmp_path_factory.mktemp("weight-dir")
    proc = start_standin(tiny_model_dir, "--weight-dir", str(weights), "--body-timeout", "1", "--head-timeout", "1",
                         "--max-request-bytes",
                         str(LIMIT), "--max-pending", "2", "--max-connections", "32", "--max-tokens", "16")
    proc.weight_dir, proc.model = weights, tiny_model_dir
    yield proc
    stop(proc)


def scores(port: int):
    a = request(port, "POST", "/score", ROW, key=KEY)
    assert a.status == 200, a
    return a.body["logprobs"]


WRONG = {"/generate": {"prompts": [[5, 6]], "params": [{"max_tokens": 10 ** 9}]},
         "/score": {"rows": [[5, "x"]]}, "/update_weights": {"path": 7}}
WRONG_FIELD = {"/generate": "params[0].max_tokens", "/score": "rows[0]", "/update_weights": "path"}


@pytest.mark.parametrize("path", ["/generate", "/score", "/update_weights"])
def test_every_attack_class_gets_its_status_and_the_server_keeps_its_weights(served, path):
    before = scores(served.port)
    good = GOOD if path != "/update_weights" else json.dumps({"path": str(served.weight_dir / "none")}).encode()
    got = battery(served.port, path, good, key=KEY, wrong_types=json.dumps(WRONG[path]).encode(), limit=LIMIT,
                  slow_s=1.0, head_s=1.0)
    want = {"slow head": 408, "no key": 401, "wrong key": 401, "missing Content-Length": 411, "negative Content-Length": 400,
            "non-numeric Content-Length": 400, "absurd Content-Length": 413, "lying Content-Length": 400,
            "oversized body": 413, "deep JSON": 400, "wrong types": 400, "slow body": 408}
    assert {k: a.status for k, a in got.items()} == want
    assert all(a.field for a in got.values()), {k: a.body for k, a in got.items()}
    assert got["wrong types"].field == WRONG_FIELD[path]
    assert all("Traceback" not in json.dumps(a.body) for a in got.values())
    assert served.poll() is None and scores(served.port) == before


def test_sampling_settings_out_of_range_are_refused_naming_the_field(served):
    for params, field in (({"max_tokens": 17}, "max_tokens"), ({"max_tokens": 2, "logprobs": 21}, "logprobs"),
                          ({"max_tokens": 2, "n": 4}, "n"), ({"max_tokens": 2, "temperature": "hot"}, "temperature"),
                          ({"max_tokens": 2, "top_p": 0}, "top_p"), ({"max_tokens": 2, "guided_json": {}}, "guided_json"),
                          ({"max_tokens": 2, "stop_token_ids": [10 ** 9]}, "stop_token_ids")):
        a = request(served.port, "POST", "/generate", json.dumps({"prompts": [[5]], "params": [params]}).encode(),
                    key=KEY)
        assert a.status == 400 and a.field == f"params[0].{field}", (params, a)
    a = request(served.port, "POST", "/generate", json.dumps({"prompts": [[10 ** 7]], "params": [{"max_tokens": 2}]})
                .encode(), key=KEY)
    assert a.status == 400 and a.field == "prompts[0]"
    assert request(served.port, "POST", "/generate", GOOD, key=KEY).status == 200


def test_weights_by_path_only_from_inside_the_weight_dir(served, tmp_path):
    """Outside the folder (an existing file or not, a ../ walk, a link out of it) is one 403 that says
    nothing of the file; a file inside with tensors that are not the model's is a 400; the model's own
    tensors, changed, load and change the scores."""
    before = scores(served.port)
    link = served.weight_dir / "link.safetensors"
    link.unlink(missing_ok=True)
    link.symlink_to(served.model / "model.safetensors")
    answers = [request(served.port, "POST", "/update_weights", json.dumps({"path": p}).encode(), key=KEY)
               for p in ("/etc/passwd", "/no/such/file", f"{served.weight_dir}/../x", str(link))]
    assert [a.status for a in answers] == [403] * 4 and len({a.body["error"]["message"] for a in answers}) == 1
    weights = load_file(served.model / "model.safetensors")
    save_file({"not.the.model": next(iter(weights.values()))}, served.weight_dir / "bad.safetensors")
    (served.weight_dir / "junk.safetensors").write_bytes(b"\xff" * 64)
    for name in ("bad.safetensors", "junk.safetensors"):
        a = request(served.port, "POST", "/update_weights",
                    json.dumps({"path": str(served.weight_dir / name)}).encode(), key=KEY)
        assert a.status == 400 and a.field == "body", a
    assert scores(served.port) == before
    save_file({k: v * 1.5 for k, v in weights.items()}, served.weight_dir / "new.safetensors")
    a = request(served.port, "POST", "/update_weights",
                json.dumps({"path": str(served.weight_dir / "new.safetensors")}).encode(), key=KEY)
    assert a.status == 200 and a.body["loaded"] == len(weights)
    assert scores(served.port) != before
    save_file(weights, served.weight_dir / "orig.safetensors")  # back, through the body this time
    body = (served.weight_dir / "orig.safetensors").read_bytes()
    a = request(served.port, "POST", "/update_weights", body, key=KEY, content_type="application/octet-stream")
    assert a.status == 200 and scores(served.port) == before


def test_96_concurrent_clients_get_200_or_429_and_the_server_serves_after(served):
    before = scores(served.port)
    statuses = flood(served.port, "POST", "/generate", GOOD, key=KEY)
    assert set(statuses) <= {200, 429} and statuses.count(200) >= 1 and statuses.count(429) >= 1, statuses
    assert served.poll() is None and scores(served.port) == before


def test_close_needs_the_key_and_an_unkeyed_public_bind_is_refused(tiny_model_dir):
    from grpo.errors import ConfigError
    from grpo.rollout.vllm.server import vllm_serve_main

    with pytest.raises(ConfigError, match=r"--host 0\.0\.0\.0: .*needs a key.*--insecure"):
        vllm_serve_main([str(tiny_model_dir), "--host", "0.0.0.0", "--api-key", ""],
                        make_engine=lambda a: pytest.fail("the engine must not load"))
    proc = start_standin(tiny_model_dir, key=None)
    try:
        a = request(proc.port, "POST", "/close", b"{}")
        assert a.status == 403 and request(proc.port, "GET", "/health").status == 200
    finally:
        stop(proc)
    proc = start_standin(tiny_model_dir)
    try:
        assert request(proc.port, "POST", "/close", b"{}", key="wrong").status == 401
        assert request(proc.port, "POST", "/close", b"{}", key=KEY).status == 200
        assert proc.wait(20) == 0
    finally:
        stop(proc)


@pytest.mark.parametrize("hang", ["/update_weights", "/generate"])
def test_a_server_that_accepts_and_never_answers_is_an_engine_error_naming_the_url_within_the_deadline(
        tiny_model_dir, hang):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo.errors import EngineError
    from grpo.rollout import SamplingSettings, make_engine
    from grpo.rollout.vllm.client import VLLMServerOptions

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    server = HangingServer({hang})
    try:
        start = time.monotonic()
        engine = make_engine("vllm_server", model, tok,
                             options=VLLMServerOptions(port=server.port, timeout=5, request_timeout=1.0))
        with pytest.raises(EngineError) as err:
            engine.generate(["What is 2 + 3?"], group_size=2, sampling=SamplingSettings(max_new_tokens=4, temperature=1.0, max_prompt_length=1024))
        took = time.monotonic() - start
    finally:
        server.close()
    what = "sync_weights" if hang == "/update_weights" else "generate"
    msg = str(err.value)
    assert f"server at http://127.0.0.1:{server.port} stopped answering during {what}" in msg and "\n" not in msg
    # the server never answers nor closes the held request (only server.close() ends it): the error came
    # from the client's own deadline; and within a bound of that deadline (x10), not forever
    assert len(server.held) == 1 and took < 10 * (1.0 + 8 * 0.01 + 5)


def wait_for_a_logged_step(proc: subprocess.Popen, run: Path, timeout: float = 300) -> Path:
    """The run's metrics.jsonl once `grpo train` (``proc``) has logged a step; it must still be running."""
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline and not (metrics.exists() and metrics.read_text()):
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read()
    return metrics


def test_grpo_train_against_a_stopped_server_ends_with_a_checkpoint_and_a_one_line_error(
        tiny_model_dir, tiny_dataset, tmp_path):
    """`grpo train rollout_engine=vllm_server` (the real command) against the server, SIGSTOPped
    after the first logged step: the run ends within its request deadline, with the last finished
    step saved and one error line naming the URL; exit code 2. (The deadline, 15 s, leaves the
    stand-in's unbatched sampling room on a loaded machine.)"""
    server = start_standin(tiny_model_dir)
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GRPO_VLLM_API_KEY": KEY}
    proc = subprocess.Popen([sys.executable, "-m", "grpo", "train", f"model={tiny_model_dir}", f"task={tiny_dataset}",
                             f"output_dir={run}", "num_generations=2", "prompts_per_step=2", "max_completion_length=4",
                             "per_device_train_batch_size=4", "eval_prompts=0", "progress=false", "report_to=none",
                             "max_steps=200", "save_steps=1000", "bf16=false", "rollout_engine=vllm_server",
                             f"vllm_server_port={server.port}", "vllm_server_request_timeout=15"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        metrics = wait_for_a_logged_step(proc, run)
        server.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        rc = proc.wait(timeout=120)
        took = time.monotonic() - stopped
    finally:
        if proc.poll() is None:
            proc.kill()
        stop(server)
    err = proc.stderr.read().strip().splitlines()
    steps = [json.loads(l)["step"] for l in metrics.read_text().splitlines()]
    assert rc == 2 and err[-1].startswith("grpo train: error: rollout engine vllm_server: the server at "
                                          f"http://127.0.0.1:{server.port} stopped answering"), err[-3:]
    assert f"checkpoint {run / 'checkpoints' / f'step-{steps[-1]}'}" in err[-1]
    assert (run / "checkpoints" / f"step-{steps[-1]}" / "model.safetensors").is_file()
    assert took < 15 + 8 * 0.01 + 60  # one call's deadline, a checkpoint and the exit: not forever
