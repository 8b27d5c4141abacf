"""Hostile requests over a raw loopback socket, for every grpo HTTP server: each attack is one
connection, bounded in time, whose status (and JSON error body) is read back."""

from __future__ import annotations

import concurrent.futures as cf
import json
import socket
import threading
import time
from dataclasses import dataclass


@dataclass
class Answer:
    status: int | str  # the HTTP status, or what happened instead ("closed", "timeout")
    body: dict | None

    @property
    def field(self):
        return ((self.body or {}).get("error") or {}).get("field") or ((self.body or {}).get("error") or {}).get("param")


def _parse(data: bytes) -> Answer:
    if not data:
        return Answer("closed", None)
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    try:
        return Answer(status, json.loads(body))
    except ValueError:
        return Answer(status, {"raw": body[:200].decode(errors="replace")})


def send(port: int, head: bytes, body: bytes = b"", *, stall: float = 0.0, close_write: bool = False,
         timeout: float = 15.0) -> Answer:
    """Send ``head`` then ``body`` (with ``stall``: two bytes of it, a pause of that many seconds, the
    rest) and read the answer until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(head)
            if stall:
                s.sendall(body[:2])
                time.sleep(stall)
            s.sendall(body[2:] if stall else body)
            if close_write:
                s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server answered and closed early: read what it said
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except TimeoutError:
            return Answer("timeout", None)
        except ConnectionResetError:
            pass
    return _parse(data)


def request(port: int, method: str, path: str, body: bytes = b"", *, key: str | None = None,
            length: str | None = "auto", content_type: str = "application/json", **kw) -> Answer:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close", f"Content-Type: {content_type}"]
    if key is not None:
        lines.append(f"Authorization: Bearer {key}")
    if length == "auto":
        if method == "POST":
            lines.append(f"Content-Length: {len(body)}")
    elif length is not None:
        lines.append(f"Content-Length: {length}")
    return send(port, ("\r\n".join(lines) + "\r\n\r\n").encode(), body, **kw)


def deep_json(depth: int = 5000) -> bytes:
    return b"[" * depth + b"]" * depth


def flood(port: int, method: str, path: str, body: bytes, *, key: str | None, clients: int = 96) -> list:
    """``clients`` connections at once, each one request; their statuses."""
    with cf.ThreadPoolExecutor(clients) as ex:
        return list(ex.map(lambda _: request(port, method, path, body, key=key, timeout=60).status, range(clients)))


def slow_head(port: int, path: str, *, head_s: float, pad: int = 400, every: float = 0.25) -> Answer:
    """A request head (``pad`` bytes of header on top) sent a byte every ``every`` seconds (each read
    well within any per-read timeout) until the server answers or closes, or ``head_s`` + 5 s pass."""
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: {'a' * pad}\r\n\r\n".encode()
    end = time.monotonic() + head_s + 5
    with socket.create_connection(("127.0.0.1", port), timeout=head_s + 10) as s:
        s.settimeout(every)
        data = b""
        for i in range(len(head)):
            if time.monotonic() > end:
                return Answer("timeout", None)
            try:
                s.sendall(head[i:i + 1])
            except OSError:
                break
            try:
                data = s.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if data:
                break
        s.settimeout(5)
        try:
            while chunk := s.recv(65536):
                data += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return _parse(data)


def battery(port: int, path: str, good: bytes, *, key: str, wrong_types: bytes, limit: int, slow_s: float,
            head_s: float | None = None) -> dict:
    """Every attack class on one keyed POST route; class -> Answer. ``limit``: the route's body limit;
    ``slow_s``: the server's body deadline (the slow body trickles past it); ``head_s``: its head
    deadline (given: a head trickled past it too)."""
    slow = {} if head_s is None else {"slow head": slow_head(port, path, head_s=head_s)}
    return {**slow,
        "no key": request(port, "POST", path, good),
        "wrong key": request(port, "POST", path, good, key=key + "x"),
        "missing Content-Length": request(port, "POST", path, good, key=key, length=None),
        "negative Content-Length": request(port, "POST", path, good, key=key, length="-5"),
        "non-numeric Content-Length": request(port, "POST", path, good, key=key, length="12abc"),
        "absurd Content-Length": request(port, "POST", path, good, key=key, length=str(10 ** 15)),
        "lying Content-Length": request(port, "POST", path, good, key=key, length=str(len(good) + 100),
                                        close_write=True),
        "oversized body": request(port, "POST", path, b"[" + b"0," * (limit // 2) + b"0]", key=key),
        "deep JSON": request(port, "POST", path, deep_json(min(5000, (limit - 16) // 2)), key=key),
        "wrong types": request(port, "POST", path, wrong_types, key=key),
        "slow body": request(port, "POST", path, good, key=key, stall=slow_s + 1.0),
    }


class HangingServer:
    """A real loopback socket server: GET /health answered, the POSTs to ``hang`` accepted and never
    answered (their connections held open until ``close``), other POSTs answered {"loaded": 0}."""

    def __init__(self, hang: set[str], health: dict | None = None):
        self.hang, self.held, self.stop = hang, [], threading.Event()
        self.health = health or {"ok": True}
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            conn.settimeout(5)
            head = b""
            while b"\r\n\r\n" not in head and (chunk := conn.recv(65536)):
                head += chunk
            method, path = head.split(b" ")[:2]
            if path.decode() in self.hang:
                self.held.append(conn)  # accepted, read, never answered
                continue
            body = json.dumps(self.health if method == b"GET" else {"loaded": 0}).encode()
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
            conn.close()

    def close(self):
        self.stop.set()
        self.thread.join()
        for c in self.held:
            c.close()
        self.sock.close()
