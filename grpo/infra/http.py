"""What every HTTP server of grpo does before a route runs (``grpo vllm-serve``, the grading service;
``grpo serve`` on FastAPI uses the same checks): loopback unless told otherwise, a bearer key compared
in constant time, ``Content-Length`` checked before a byte of the body is read, a whole-body deadline,
bounded JSON, bounded connections and work, and every error a JSON body naming the field.

A server here is a ``GuardedServer`` (the standard library's threading server, one thread per
connection up to ``max_connections``; past that a connection gets a 429 and is closed) with a table
of ``Route``s. A route's function takes the body (bytes, read whole within the limits) and its
content type and returns a JSON-able dict; it raises ``HttpError`` for a bad request (4xx naming the
field). Any other exception is a 500 whose body names the exception's type, never a traceback.
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import json
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

import numpy as np

from grpo.errors import ConfigError
from grpo.infra.http_guards import Cutoff, send_raw

BODY_MIN_RATE = 10e6  # bytes/s: a large body (weights) gets body_timeout_s plus its size at this rate
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)  # JSON strings: brackets inside them do not nest


class HttpError(Exception):
    """A refused request: its status, the field at fault (None: the request as a whole), a message
    naming it; optional response headers (Retry-After)."""

    def __init__(self, status: int, field_name: str | None, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.field, self.message, self.headers = status, field_name, message, headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "field": self.field, "status": self.status}}


@dataclass
class HttpLimits:
    """What one server accepts: body bytes, JSON nesting, open connections, and seconds for a request's
    head and for its whole body (a client that trickles either is cut off with a 408)."""

    max_body_bytes: int = 1 << 20
    max_json_depth: int = 32
    max_connections: int = 64
    head_timeout_s: float = 10.0
    body_timeout_s: float = 30.0


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None, *, insecure: bool, env: str) -> None:
    """A server reachable from other machines needs a key, unless the user said ``--insecure``."""
    if not is_loopback(host) and not api_key and not insecure:
        raise ConfigError(f"--host {host}: binding beyond loopback needs a key (--api-key or ${env}); "
                          f"to serve without one anyway, say --insecure")


def key_matches(authorization: str | None, key: str | None) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <key>`` (constant-time; no key: always)."""
    if not key:
        return True
    return hmac.compare_digest((authorization or "").encode(), f"Bearer {key}".encode())


def require_key(authorization: str | None, key: str | None) -> None:
    if not key_matches(authorization, key):
        raise HttpError(401, "authorization", "authorization: a valid 'Bearer <api key>' header is required",
                        headers={"WWW-Authenticate": "Bearer"})


def body_length(headers, limit: int) -> int:
    """The body's length from ``Content-Length``, checked before any of it is read: a chunked or
    unlabelled body is a 411, a negative or non-numeric length a 400, one over ``limit`` a 413."""
    if headers.get("transfer-encoding"):
        raise HttpError(411, "transfer-encoding", "transfer-encoding: not accepted; send a Content-Length")
    raw = headers.get("content-length")
    if raw is None:
        raise HttpError(411, "content-length", "content-length: required")
    raw = raw.strip()
    if not raw.isascii() or not raw.isdigit():
        raise HttpError(400, "content-length", f"content-length: {raw[:40]!r} is not a non-negative integer")
    n = int(raw)
    if n > limit:
        raise HttpError(413, "content-length", f"content-length: {n} bytes, over the limit of {limit}")
    return n


def json_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in a JSON text, found without parsing it (so a deep
    document cannot exhaust the parser's recursion)."""
    flat = np.frombuffer(_STRINGS.sub(b"", raw), dtype=np.uint8)
    step = np.isin(flat, (ord("["), ord("{"))).astype(np.int32) - np.isin(flat, (ord("]"), ord("}")))
    return int(np.cumsum(step).max(initial=0))


def parse_json(raw: bytes, *, max_depth: int) -> dict:
    """A JSON object of at most ``max_depth`` levels; HttpError 400 naming the body otherwise."""
    depth = json_depth(raw)
    if depth > max_depth:
        raise HttpError(400, "body", f"body: JSON nested {depth} levels deep, over the limit of {max_depth}")
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise HttpError(400, "body", f"body: not valid JSON ({str(e)[:120]})") from None
    if not isinstance(body, dict):
        raise HttpError(400, "body", f"body: a JSON object expected, got {type(body).__name__}")
    return body


@dataclass
class Gate:
    """At most ``n`` requests of a route at work at once; one more is a 429 (never queued unboundedly)."""

    n: int
    name: str = "requests"
    _sem: threading.BoundedSemaphore = field(init=False, repr=False)

    def __post_init__(self):
        self._sem = threading.BoundedSemaphore(self.n)

    def __enter__(self):
        if not self._sem.acquire(blocking=False):
            raise HttpError(429, None, f"busy: {self.n} {self.name} already at work; retry later",
                            headers={"Retry-After": "1"})

    def __exit__(self, *exc):
        self._sem.release()


@dataclass
class Route:
    """``fn(body: bytes, content_type: str) -> dict``; ``keyed``: needs the key when one is set;
    ``max_bytes(content_type)``: this route's body limit (None: the server's); ``gate``: its
    concurrency bound."""

    fn: Callable[[bytes, str], dict]
    keyed: bool = True
    max_bytes: Callable[[str], int | None] | None = None
    gate: Gate | None = None


class GuardedHandler(BaseHTTPRequestHandler):
    server: "GuardedServer"
    protocol_version = "HTTP/1.0"  # one request per connection: an idle client holds no thread

    _head: Cutoff

    def setup(self):
        super().setup()
        self.connection.settimeout(self.server.limits.head_timeout_s)  # no byte for this long: dropped

    def handle_one_request(self):
        """The request, its whole head (request line and headers) within ``head_timeout_s`` however it
        trickles in: past that the reading side is shut (a blocked read returns at once), the client
        gets a 408 and its connection slot is freed. A per-read timeout alone would let a client that
        sends a byte every half second hold the slot for as long as its head lasts."""
        watch = Cutoff(self.connection, self.server.limits.head_timeout_s, socket.SHUT_RD)
        self._head = watch
        try:
            super().handle_one_request()
        finally:
            expired = watch.stop()
        if expired:
            self.close_connection = True
            try:
                send_raw(self.connection, 408, "Request Timeout",
                         HttpError(408, "head", f"head: the request line and headers took over "
                                   f"{self.server.limits.head_timeout_s:g} s; too slow").body())
            except OSError:  # the client is gone already
                pass

    def log_message(self, fmt, *args):  # one line per request would flood a trainer's or grader's log
        pass

    def send_json(self, status: int, payload: dict, headers: dict | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def send_error(self, code, message=None, explain=None):  # the parser's own refusals, as JSON too
        self.close_connection = True
        if self._head.stop():  # a head cut at its deadline: the 408 is the answer (stop() ends the watch)
            return
        try:
            self.send_json(code, HttpError(code, None, message or self.responses.get(code, ("",))[0]).body())
        except OSError:
            pass

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def _read_body(self, limit: int) -> bytes:
        n = body_length(self.headers, limit)
        allowed = self.server.limits.body_timeout_s + n / BODY_MIN_RATE
        deadline = time.monotonic() + allowed
        chunks, got = [], 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise HttpError(408, "body", f"body: {got} of {n} bytes arrived in {allowed:g} s; too slow")
            self.connection.settimeout(left)
            try:
                chunk = self.rfile.read1(min(n - got, 1 << 20))
            except TimeoutError:  # the whole remaining budget passed without a byte
                raise HttpError(408, "body", f"body: {got} of {n} bytes arrived in {allowed:g} s; too slow") from None
            if not chunk:
                raise HttpError(400, "body", f"body: the connection ended after {got} of {n} bytes")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _dispatch(self, method: str) -> None:
        server, read = self.server, False
        if self._head.stop():  # the deadline passed as the head ended: handle_one_request answers 408
            self.close_connection = True
            return
        try:
            route = server.routes.get((method, self.path.split("?")[0]))
            if route is None:
                raise HttpError(404, "path", f"path: no endpoint {method} {self.path[:200]}")
            if route.keyed:
                require_key(self.headers.get("authorization"), server.api_key)
            body, kind = b"", self.headers.get("content-type", "")
            if method == "POST":
                limit = route.max_bytes(kind) if route.max_bytes else None
                body = self._read_body(limit or server.limits.max_body_bytes)
            read = True
            self.connection.settimeout(self.server.limits.body_timeout_s)  # for the answer: a client that never reads it
            if route.gate is None:
                out = route.fn(body, kind)
            else:
                with route.gate:
                    out = route.fn(body, kind)
            self.send_json(200, out)
        except HttpError as e:
            self.close_connection = True
            self.connection.settimeout(self.server.limits.head_timeout_s)
            self.send_json(e.status, e.body(), e.headers)
            if not read:
                self._drain()
        except Exception as e:  # a failure inside the route: a 500 for this request; the server keeps serving
            self.connection.settimeout(self.server.limits.head_timeout_s)
            self.send_json(500, HttpError(500, None, f"internal error: {type(e).__name__}: {str(e)[:300]}").body())

    def _drain(self) -> None:
        """Discard (briefly, boundedly) what the client still sends of a refused body, so that closing
        the connection does not reset the answer away before the client reads it."""
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            deadline, left = time.monotonic() + 0.5, 1 << 20
            while left > 0 and time.monotonic() < deadline:
                self.connection.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = self.connection.recv(min(left, 65536))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:
            pass


class GuardedServer(ThreadingHTTPServer):
    """A threading HTTP server with a route table, a key and limits (module docstring)."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], routes: dict[tuple[str, str], Route], *, api_key: str | None,
                 limits: HttpLimits, handler: type[GuardedHandler] = GuardedHandler):
        super().__init__(address, handler)
        self.routes, self.api_key, self.limits = routes, api_key or None, limits
        self._count = threading.Lock()
        self.active = 0

    def process_request(self, request, client_address):
        with self._count:
            full = self.active >= self.limits.max_connections
            if not full:
                self.active += 1
        if full:
            threading.Thread(target=_refuse, args=(request,), daemon=True).start()
            return
        super().process_request(request, client_address)

    def handle_error(self, request, client_address):
        """A handler's exceptions are answered inside it; what reaches here is a client gone mid-answer
        (a reset, a timeout writing to it): nothing to tell anyone, and no traceback on the server's log."""

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._count:
                self.active -= 1


def _refuse(sock: socket.socket) -> None:
    """Answer a connection over the limit with a 429 and close it (reading what it sent first, briefly,
    so that the close does not reset the answer away)."""
    try:
        send_raw(sock, 429, "Too Many Requests", HttpError(429, None, "busy: too many open connections; retry "
                                                                      "later").body(), b"Retry-After: 1\r\n")
        for _ in range(16):
            if not sock.recv(65536):
                break
    except OSError:
        pass
    finally:
        sock.close()


def add_server_flags(ap: argparse.ArgumentParser, *, port: int, env: str, max_body_bytes: int) -> None:
    """The flags every grpo HTTP server takes (``limits_of`` reads them back)."""
    g = ap.add_argument_group("network and limits")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only; any other "
                   "needs a key or --insecure)")
    g.add_argument("--port", type=int, default=port)
    g.add_argument("--api-key", default=os.environ.get(env) or None,
                   help=f"require 'Authorization: Bearer KEY' on every route (default: ${env}; unset: no key)")
    g.add_argument("--insecure", action="store_true", help="allow a non-loopback --host without a key")
    g.add_argument("--max-request-bytes", type=int, default=max_body_bytes, help="largest request body")
    g.add_argument("--max-connections", type=int, default=64, help="open connections before 429")
    g.add_argument("--body-timeout", type=float, default=30.0, help="seconds a request's whole body may take")
    g.add_argument("--head-timeout", type=float, default=10.0, help="seconds a request's whole head may take, "
                   "however it trickles in (408 past it)")


def limits_of(args, *, env: str) -> HttpLimits:
    """The limits of ``add_server_flags``' flags, after refusing an unkeyed non-loopback bind."""
    check_bind(args.host, args.api_key, insecure=args.insecure, env=env)
    for name in ("max_request_bytes", "max_connections", "port"):
        if getattr(args, name) < (0 if name == "port" else 1):
            raise ConfigError(f"--{name.replace('_', '-')}: {getattr(args, name)} is out of range")
    for name in ("body_timeout", "head_timeout"):
        if getattr(args, name) <= 0:
            raise ConfigError(f"--{name.replace('_', '-')}: must be > 0, got {getattr(args, name)}")
    return HttpLimits(max_body_bytes=args.max_request_bytes, max_connections=args.max_connections,
                      body_timeout_s=args.body_timeout, head_timeout_s=args.head_timeout)
