"""Deadlines over whole messages, not single reads: a client that trickles its request head loses its
connection slot at head_timeout_s (a 408), and exchange() returns at its deadline from a server that
trickles its answer's head or body, however regularly each byte arrives."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from grpo.infra.http import Gate, GuardedServer, HttpLimits, Route
from grpo.infra.http_client import exchange
from tests.hostile import slow_head


HEAD_S = 1.0  # the guarded server's head deadline


def _until(condition, limit_s: float = 60.0) -> None:
    """Wait for a state the server reaches, however loaded the machine (the limit only ends a hang)."""
    end = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < end, "the server never reached the state waited for"
        time.sleep(0.01)


@pytest.fixture
def guarded():
    """A GuardedServer with 2 connection slots and a 1 s head deadline, one unkeyed route."""
    routes = {("GET", "/ok"): Route(lambda body, kind: {"ok": True}, keyed=False)}
    server = GuardedServer(("127.0.0.1", 0), routes, api_key=None,
                           limits=HttpLimits(max_connections=2, head_timeout_s=HEAD_S))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _trickle_head(port: int, out: dict, key: str) -> None:
    """A 1 KB request head trickled at 2 bytes/s (tests/hostile.py: slow_head): its answer and when it came."""
    start = time.monotonic()
    out[key] = (slow_head(port, "/ok", head_s=HEAD_S, pad=1000, every=0.5), time.monotonic() - start)


def _get(port: int, path: str = "/ok") -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    return int(data.split(b" ", 2)[1]), data


def test_two_trickled_heads_lose_their_slots_and_an_honest_request_is_served(guarded):
    port = guarded.server_address[1]
    out = {}
    clients = [threading.Thread(target=_trickle_head, args=(port, out, k)) for k in ("a", "b")]
    for c in clients:
        c.start()
    _until(lambda: guarded.active == 2)  # both slots held by the trickling heads
    for c in clients:
        c.join(timeout=30)
    for key in ("a", "b"):
        answer, seconds = out[key]
        assert answer.status == 408 and answer.field == "head", out
        assert seconds < 2 * HEAD_S, out  # the deadline's time, twice over: a 1 KB head at 2 bytes/s takes 8 minutes
    _until(lambda: guarded.active == 0)
    status, body = _get(port)
    assert status == 200 and b'"ok": true' in body


def test_the_connection_cap_alone_refuses_the_third_connection(guarded):
    """With both slots held (heads in progress, inside their deadline), a third connection gets the 429
    of the connection cap, not of a route gate (this route has none)."""
    port = guarded.server_address[1]
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
    try:
        for s in held:
            s.sendall(b"GET /ok HTTP/1.0\r\n")  # heads begun, not finished
        _until(lambda: guarded.active == 2)
        status, body = _get(port)
        assert status == 429 and b"too many open connections" in body
    finally:
        for s in held:
            s.close()


def test_the_request_gate_alone_refuses_work_past_its_bound():
    """A route's gate (one grading at a time) with connections to spare: while the one place is taken
    the next request gets the gate's 429, and once it is free the same request is served."""
    gate = Gate(1, "gradings")
    routes = {("GET", "/work"): Route(lambda body, kind: {"ok": True}, keyed=False, gate=gate)}
    server = GuardedServer(("127.0.0.1", 0), routes, api_key=None, limits=HttpLimits(max_connections=64))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        gate.__enter__()
        status, body = _get(port, "/work")
        assert status == 429 and b"busy: 1 gradings already at work" in body
        gate.__exit__(None, None, None)
        status, body = _get(port, "/work")
        assert status == 200 and b'"ok": true' in body
    finally:
        server.shutdown()
        server.server_close()


def _server(at_once: bytes, trickled: bytes, stop: threading.Event) -> socket.socket:
    """A loopback server that reads a request, sends ``at_once``, then ``trickled`` a byte every 0.2 s
    (until ``stop``)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def serve():
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(5)
            conn.recv(65536)
            try:
                conn.sendall(at_once)
                for i in range(len(trickled)):
                    if stop.is_set():
                        return
                    conn.sendall(trickled[i:i + 1])
                    time.sleep(0.2)
            except OSError:
                return

    threading.Thread(target=serve, daemon=True).start()
    return srv


@pytest.mark.parametrize("part", ["head", "body"])
def test_exchange_returns_at_its_deadline_from_a_server_that_trickles(part):
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Pad: " + b"a" * 200 +
            b"\r\nContent-Length: 400\r\n\r\n")
    stop = threading.Event()
    srv = _server(b"", head, stop) if part == "head" else _server(head, b"x" * 400, stop)
    try:
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="no complete answer within 1 s"):
            exchange(f"http://127.0.0.1:{srv.getsockname()[1]}/x", method="GET", deadline_s=1.0)
        assert time.monotonic() - start < 1.5 * 1.0  # the deadline and half again; a trickled head took 7.6 s
    finally:
        stop.set()
        srv.close()
