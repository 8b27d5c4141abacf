"""The `grpo serve` command itself, as a subprocess on a tiny run folder: the default bind (loopback),
the key from $GRPO_SERVE_API_KEY on every route (/health and /metrics too), `--fallback base`, every
hostile request answered with its status while the server keeps serving, 96 concurrent clients, and
SIGTERM: a request on a kept-alive connection gets 503 while the requests in flight are answered, then
exit 0."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from grpo.cli import main
from tests.conftest import TEST_SEED
from tests.hostile import battery, flood, request

ROOT = Path(__file__).resolve().parents[1]
KEY = "serve-key-5e1"
LIMIT = 4096
CHAT = {"model": "grpo", "max_tokens": 2, "messages": [{"role": "user", "content": "What is 2 + 3?"}]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening_address(port: int) -> str:
    """The local address a socket listening on ``port`` is bound to (from /proc/net/tcp)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, p = local.split(":")
        if int(p, 16) == port and state == "0A":  # LISTEN
            return socket.inet_ntoa(bytes.fromhex(addr)[::-1])
    return "none"


@pytest.fixture(scope="module")
def run_folder(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-run")
    task = root / "sums.jsonl"
    task.write_text("".join(json.dumps({"prompt": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n"
                            for a in range(1, 5) for b in range(1, 5)))
    run = root / "run"
    assert main(["train", f"model={tiny_model_dir}", f"task={task}", f"output_dir={run}", "max_steps=1",
                 "num_generations=2", "prompts_per_step=2", "max_completion_length=4", "eval_prompts=0",
                 "progress=false", "report_to=none", "bf16=false", f"seed={TEST_SEED}"]) == 0
    return run


@pytest.fixture(scope="module")
def served(run_folder):
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GRPO_SERVE_API_KEY": KEY}
    proc = subprocess.Popen([sys.executable, "-m", "grpo", "serve", str(run_folder), "--port", str(port),
                             "--fallback", "base", "--max-batch", "2", "--deadline", "30", "--max-request-bytes",
                             str(LIMIT), "--body-timeout", "1", "--head-timeout", "1", "--max-connections", "16",
                             "--max-queue", "8"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.port = port
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        try:
            if request(port, "GET", "/health", key=KEY).status == 200:
                break
        except OSError:
            time.sleep(0.3)
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _chat(port: int, key: str | None = KEY):
    return request(port, "POST", "/v1/chat/completions", json.dumps(CHAT).encode(), key=key, timeout=60)


def test_default_bind_is_loopback_and_every_route_needs_the_env_key(served):
    assert _listening_address(served.port) == "127.0.0.1"
    for path in ("/health", "/metrics", "/v1/models"):
        assert request(served.port, "GET", path).status == 401
        assert request(served.port, "GET", path, key="wrong").status == 401
        assert request(served.port, "GET", path, key=KEY).status == 200
    a = _chat(served.port)
    assert a.status == 200 and a.body["answered_by"] in ("grpo", "base")


def test_the_runs_prompt_limit_is_the_servers(served, run_folder):
    """Without --max-prompt-tokens the command serves the run's own max_prompt_length (its
    config.yaml's): a prompt one token over it is a 400 naming the limit, one at it is answered."""
    import yaml

    from tests.conftest import build_tokenizer

    limit = yaml.safe_load((run_folder / "config.yaml").read_text())["max_prompt_length"]
    tok = build_tokenizer()  # a token per ASCII character: the template's tokens and the content's add up
    text = tok.apply_chat_template([{"role": "user", "content": ""}], tokenize=False, add_generation_prompt=True)
    template = len(tok(text, add_special_tokens=False)["input_ids"])
    over = {**CHAT, "messages": [{"role": "user", "content": "x" * (limit - template + 1)}]}
    a = request(served.port, "POST", "/v1/chat/completions", json.dumps(over).encode(), key=KEY, timeout=60)
    assert a.status == 400 and f"over the limit of {limit} (--max-prompt-tokens)" in a.body["error"]["message"]
    at = {**CHAT, "messages": [{"role": "user", "content": "x" * (limit - template)}]}
    assert request(served.port, "POST", "/v1/chat/completions", json.dumps(at).encode(), key=KEY,
                   timeout=60).status == 200


def test_every_attack_class_gets_its_status_and_the_server_keeps_serving(served):
    got = battery(served.port, "/v1/chat/completions", json.dumps(CHAT).encode(), key=KEY, limit=LIMIT, slow_s=1.0,
                  head_s=1.0,
                  wrong_types=json.dumps({**CHAT, "max_tokens": "ten"}).encode())
    assert {k: a.status for k, a in got.items()} == {
        "no key": 401, "wrong key": 401, "missing Content-Length": 411, "negative Content-Length": 400,
        "non-numeric Content-Length": 400, "absurd Content-Length": 413, "lying Content-Length": 400,
        "oversized body": 413, "deep JSON": 400, "wrong types": 400, "slow body": 408, "slow head": 408}
    assert all(a.body and "error" in a.body for a in got.values()), {k: a.body for k, a in got.items()}
    assert got["wrong types"].field == "max_tokens" and got["deep JSON"].field == "body"
    assert served.poll() is None and _chat(served.port).status == 200
    assert _settled(served.port)


def _settled(port: int) -> bool:
    """Nothing queued or in flight (a request's count ends just after its answer is sent: waits for it;
    the limit only ends a test that would otherwise hang)."""
    end = time.monotonic() + 120
    while time.monotonic() < end:
        if request(port, "GET", "/health", key=KEY).body == {"status": "ok", "queue": {"grpo": 0, "base": 0},
                                                              "requests": 0}:
            return True
        time.sleep(0.1)
    return False


def _until_draining(port: int) -> None:
    end = time.monotonic() + 120
    while request(port, "GET", "/health", key=KEY).status != 503:
        assert time.monotonic() < end, "the server never began draining"
        time.sleep(0.01)


def test_96_concurrent_clients_get_200_or_429_and_the_server_serves_after(served):
    statuses = flood(served.port, "POST", "/v1/chat/completions", json.dumps(CHAT).encode(), key=KEY)
    assert set(statuses) <= {200, 429} and statuses.count(200) >= 1 and statuses.count(429) >= 1, statuses
    assert _chat(served.port).status == 200
    assert _settled(served.port)


def test_sigterm_answers_in_flight_requests_refuses_a_kept_alive_one_with_503_and_exits_0(served):
    """Last in the module: it stops the server."""
    long = {**CHAT, "max_tokens": 256}  # in flight across the signal; 6 of them at batch 2 still end on a loaded CPU
    with httpx.Client(base_url=f"http://127.0.0.1:{served.port}", timeout=600,
                      headers={"Authorization": f"Bearer {KEY}"}) as kept, cf.ThreadPoolExecutor(6) as ex:
        assert kept.get("/health").status_code == 200  # the connection is now open and kept alive
        flying = [ex.submit(httpx.post, f"http://127.0.0.1:{served.port}/v1/chat/completions", json=long,
                            headers={"Authorization": f"Bearer {KEY}"}, timeout=600) for _ in range(6)]
        while True:  # every request in flight (or answered) before the signal; answered ones counted first,
            done = sum(f.done() for f in flying)  # so that none is counted twice
            if done + kept.get("/health").json()["requests"] >= len(flying):
                break
            time.sleep(0.01)
        served.send_signal(signal.SIGTERM)
        _until_draining(served.port)  # the signal handled (a new connection's /health says so), however loaded
        refused = kept.post("/v1/chat/completions", json=CHAT)
        answered = [f.result() for f in flying]
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "unavailable"
    assert [r.status_code for r in answered] == [200] * 6
    assert served.wait(60) == 0
    assert "drained and stopped" in served.stdout.read()


def test_an_unkeyed_public_bind_is_refused_before_any_model_loads(capsys, monkeypatch):
    monkeypatch.delenv("GRPO_SERVE_API_KEY", raising=False)
    assert main(["serve", "/no/such/run", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "--host 0.0.0.0: binding beyond loopback needs a key" in err and "--insecure" in err
