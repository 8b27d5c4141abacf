"""grpo.serve.bench.wait_healthy against a real keyed server on loopback: the key it sends opens
/health, a request without it gets a 401 and the server keeps serving, and a process that exits
first is a one-line SystemExit naming it."""

from __future__ import annotations

import subprocess
import sys
import threading

import httpx
import pytest

from grpo.infra.http import GuardedServer, HttpLimits, Route
from grpo.serve.bench import wait_healthy

KEY = "test-key"


@pytest.fixture
def server():
    srv = GuardedServer(("127.0.0.1", 0), {("GET", "/health"): Route(lambda raw, kind: {"ok": True})}, api_key=KEY,
                        limits=HttpLimits())
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def alive():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait(timeout=10)


def test_the_key_opens_health_and_a_request_without_it_is_refused_while_the_server_serves(server, alive):
    assert not wait_healthy(server, alive, timeout=1.5, name="s", log="s.log")  # no key: 401 until the timeout
    assert httpx.get(f"{server}/health", timeout=5).status_code == 401
    assert httpx.post(f"{server}/nowhere", content=b"{", timeout=5).status_code // 100 == 4
    assert wait_healthy(server, alive, timeout=10, name="s", log="s.log", headers={"Authorization": f"Bearer {KEY}"})


def test_a_process_that_exits_first_is_named(server):
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait(timeout=30)
    with pytest.raises(SystemExit, match="grpo serve exited with 3 before it was healthy"):
        wait_healthy(server, proc, timeout=10, name="grpo serve", log="x.log")
