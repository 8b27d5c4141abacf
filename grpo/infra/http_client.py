"""One HTTP exchange with a deadline, for every client of grpo (the vLLM server's, the grading
service's, remote rewards): a connect timeout, a deadline for the whole exchange (sending, the answer's
head and its body), and a cap on the answer's size. It runs in the calling thread and closes its
socket on every way out, so an exchange that missed its deadline leaves nothing reading behind."""

from __future__ import annotations

import http.client
import time
import urllib.parse
from dataclasses import dataclass

from grpo.infra.http_guards import Cutoff


@dataclass
class Reply:
    status: int
    body: bytes
    content_type: str


class TooLarge(Exception):
    """The answer is longer than the caller's cap."""


def exchange(url: str, *, method: str = "POST", body: bytes | None = None, headers: dict | None = None,
             deadline_s: float, connect_s: float = 10.0, max_reply_bytes: int = 64 << 20) -> Reply:
    """``method url`` with ``body``; TimeoutError once ``deadline_s`` passed (the connection within
    ``connect_s`` of it), TooLarge past ``max_reply_bytes``, OSError / HTTPException when the
    connection fails. Any status is returned; the caller decides what it means."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http(s) URL")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    start = time.monotonic()
    conn = cls(parts.hostname, parts.port, timeout=min(connect_s, deadline_s))
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    def left() -> float:
        rest = deadline_s - (time.monotonic() - start)
        if rest <= 0:
            raise TimeoutError(f"{url}: no complete answer within {deadline_s:g} s")
        return rest

    sock = resp = watch = None
    try:
        try:
            conn.connect()
            sock = conn.sock  # kept: the connection hands its socket to a response that closes it
            # the deadline for the whole exchange: a per-read timeout alone lets a server that trickles
            # its head or body a byte at a time hold the call for as long as it likes
            watch = Cutoff(sock, left())
            sock.settimeout(left())
            conn.request(method, path, body=body, headers=headers or {})
            sock.settimeout(left())
            resp = conn.getresponse()
            declared = resp.getheader("content-length")
            if declared is not None and declared.isdigit() and int(declared) > max_reply_bytes:
                raise TooLarge(f"{url}: an answer of {declared} bytes, over the cap of {max_reply_bytes}")
            chunks, size = [], 0
            while True:
                sock.settimeout(left())
                chunk = resp.read1(1 << 20)
                if not chunk:
                    break
                size += len(chunk)
                if size > max_reply_bytes:
                    raise TooLarge(f"{url}: an answer over the cap of {max_reply_bytes} bytes")
                chunks.append(chunk)
        except TimeoutError as e:  # a socket timeout: the deadline's remainder passed
            if "no complete answer" in str(e):
                raise
            raise TimeoutError(f"{url}: no complete answer within {deadline_s:g} s") from None
        except (OSError, http.client.HTTPException):
            if watch is not None and watch.expired:  # the cut-off shut the socket under a read
                raise TimeoutError(f"{url}: no complete answer within {deadline_s:g} s") from None
            raise
        if watch.stop():  # a read the cut-off ended looks like the end of the answer
            raise TimeoutError(f"{url}: no complete answer within {deadline_s:g} s")
        return Reply(resp.status, b"".join(chunks), resp.getheader("content-type") or "")
    finally:
        if watch is not None:
            watch.stop()
        if resp is not None:
            resp.close()
        conn.close()
        if sock is not None:
            sock.close()


def bearer(key: str | None) -> dict:
    return {"Authorization": f"Bearer {key}"} if key else {}
