"""The code grading service on a live loopback server with the real sandbox: the key, the limits
(413, 429), hostile requests answered with their status while the service keeps grading and its
sandbox slots stay free; the client's key, its per-share deadline proportional to the work, and a
service that accepts and never answers failing its share within that deadline."""

from __future__ import annotations

import json
import shutil
import threading
import time

import pytest

from grpo.errors import SandboxError
from grpo.rewards import code, code_rewards
from grpo.rewards import grading_service
from grpo.rewards.code import CodeGrader
from tests.hostile import HangingServer, battery, flood, request

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
KEY = "grader-key-19c"
LIMIT = 1 << 16
COMPLETIONS = ["def f(x):\n    return 2 * x\n", "def f(x):\n    return 4\n"]
SAMPLES = [{"tests": ["assert f(2) == 4", "assert f(5) == 10"]}] * 2
GOOD = json.dumps({"completions": COMPLETIONS, "samples": SAMPLES}).encode()


@pytest.fixture(scope="module")
def service():
    grader = CodeGrader(test_timeout=2.0, program_timeout=6.0, slots=2)
    grader.check()
    server = grading_service.make_server(
        "127.0.0.1", 0, grader, api_key=KEY,
        http=grading_service.HttpLimits(max_body_bytes=LIMIT, body_timeout_s=1.0, head_timeout_s=1.0,
                                        max_connections=32),
        limits=grading_service.GradingLimits(max_completions=4, max_tests=16, max_concurrent=1))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.port, server.grader = server.server_address[1], grader
    yield server
    server.shutdown()
    server.server_close()


def _idle(service) -> bool:
    """Every sandbox slot free and no connection but the caller's open (waits a little for closes)."""
    for _ in range(50):
        if service.grader.sandbox._slots.qsize() == service.grader.slots and service.active == 0:
            return True
        time.sleep(0.1)
    return False


def _grades(service) -> list:
    a = request(service.port, "POST", "/grade", GOOD, key=KEY)
    assert a.status == 200, a
    return a.body["scores"]


def test_every_attack_class_gets_its_status_and_the_service_keeps_grading(service):
    got = battery(service.port, "/grade", GOOD, key=KEY, limit=LIMIT, slow_s=1.0, head_s=1.0,
                  wrong_types=json.dumps({"completions": [1, 2], "samples": SAMPLES}).encode())
    assert {k: a.status for k, a in got.items()} == {
        "no key": 401, "wrong key": 401, "missing Content-Length": 411, "negative Content-Length": 400,
        "non-numeric Content-Length": 400, "absurd Content-Length": 413, "lying Content-Length": 400,
        "oversized body": 413, "deep JSON": 400, "wrong types": 400, "slow body": 408, "slow head": 408}
    assert got["wrong types"].field == "completions" and all(a.field for a in got.values())
    assert request(service.port, "GET", "/health").status == 401 and request(service.port, "GET", "/health", key=KEY).status == 200
    assert _idle(service) and _grades(service) == [1.0, 0.5]


def test_batch_limits_are_413_naming_the_field(service):
    many = json.dumps({"completions": COMPLETIONS * 3, "samples": SAMPLES * 3}).encode()
    tests = json.dumps({"completions": COMPLETIONS, "samples": [{"tests": ["assert f(1) == 2"] * 9}] * 2}).encode()
    for body, field in ((many, "completions"), (tests, "samples")):
        a = request(service.port, "POST", "/grade", body, key=KEY)
        assert a.status == 413 and a.field == field, a
    assert _idle(service)


def test_96_concurrent_clients_get_200_or_429_and_the_service_grades_after(service):
    statuses = flood(service.port, "POST", "/grade", GOOD, key=KEY)
    assert set(statuses) <= {200, 429} and statuses.count(200) >= 1 and statuses.count(429) >= 1, statuses
    assert _idle(service) and _grades(service) == [1.0, 0.5]


def test_the_client_sends_the_key_and_retries_429_within_its_deadline(service, monkeypatch):
    grading_service.SERVICES.clear()  # each service is asked for /health afresh
    url = f"http://127.0.0.1:{service.port}"
    monkeypatch.setenv("GRPO_CODE_GRADER_URL", url)
    monkeypatch.delenv("GRPO_CODE_GRADER_KEY", raising=False)
    with pytest.raises(SandboxError, match="HTTP 401.*GRPO_CODE_GRADER_KEY"):
        code_rewards.check_code_sandbox()
    monkeypatch.setenv("GRPO_CODE_GRADER_KEY", KEY)
    code_rewards.check_code_sandbox()
    gate = service.routes[("POST", "/grade")].gate
    gate.__enter__()  # the one grading place taken for a second: the client's first tries get 429
    released = threading.Event()
    threading.Timer(1.0, lambda: (released.set(), gate.__exit__(None, None, None))).start()
    assert request(service.port, "POST", "/grade", GOOD, key=KEY).status == 429
    assert code_rewards.code_batch_reward(COMPLETIONS, SAMPLES) == [1.0, 0.5]
    assert released.is_set()  # graded only once the place was free: the client retried its 429s


def test_share_deadline_is_proportional_to_the_work():
    health = {"slots": 4, "test_seconds": 2.0, "program_seconds": 5.0}
    two = [{"tests": ["a", "b"]}] * 8  # each program: 2 tests x 2 s = 4 s (under its 5 s)
    five = [{"io": [{}] * 5}] * 8  # each program: capped at 5 s
    assert grading_service.share_deadline(two, health, 30.0) == pytest.approx(30 + 2 * 8 * 4 / 4)
    assert grading_service.share_deadline(five, health, 30.0) == pytest.approx(30 + 2 * 8 * 5 / 4)
    assert grading_service.share_deadline(two * 2, health, 30.0) == pytest.approx(30 + 2 * 16 * 4 / 4)


def test_a_service_that_accepts_and_never_answers_fails_its_share_within_the_deadline(monkeypatch):
    health = {"ok": True, "version": 1, "slots": 2, "test_seconds": 0.1, "program_seconds": 0.2}
    server = HangingServer({"/grade"}, health)
    grading_service.SERVICES.clear()  # each service is asked for /health afresh
    monkeypatch.setenv("GRPO_CODE_GRADER_URL", f"http://127.0.0.1:{server.port}")
    monkeypatch.setenv("GRPO_CODE_GRADER_TIMEOUT", "1")
    try:
        start = time.monotonic()
        out = code_rewards.code_batch_reward(COMPLETIONS, SAMPLES)
        took = time.monotonic() - start
    finally:
        server.close()
    deadline = 1 + 2 * 2 * 0.2 / 2
    assert all(isinstance(x, RuntimeError) and "no complete answer" in str(x) for x in out), out
    assert deadline <= took < deadline + 5 and len(server.held) == 1


def test_an_unkeyed_public_bind_is_refused_before_the_sandbox_starts(monkeypatch):
    from grpo.errors import ConfigError

    monkeypatch.delenv("GRPO_CODE_GRADER_KEY", raising=False)
    monkeypatch.setattr(CodeGrader, "check", lambda self: pytest.fail("the sandbox must not start"))
    with pytest.raises(ConfigError, match="--host 0.0.0.0: .*needs a key"):
        grading_service.main(["--host", "0.0.0.0"])
