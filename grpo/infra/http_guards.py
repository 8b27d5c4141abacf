"""The parts of a guarded server's deadlines that act on the socket itself: a watch over a request
head's whole time (``HeadWatch``) and an answer written straight to the socket (``send_raw``), for
where the handler's own response machinery cannot answer (a head cut at its deadline, a connection
over the limit). Used by grpo.infra.http."""

from __future__ import annotations

import json
import socket
import threading


class HeadWatch:
    """A deadline for a request's whole head: at ``seconds`` after it starts, unless ``done()`` came
    first, it shuts the socket's reading side (the handler's blocked read returns, as at the end of the
    stream) and marks itself ``expired``; ``done()`` says whether the head arrived in time."""

    def __init__(self, sock: socket.socket, seconds: float):
        self.sock, self.expired, self._finished = sock, False, False
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        with self._lock:
            if self._finished:
                return
            self.expired = True
        try:
            self.sock.shutdown(socket.SHUT_RD)
        except OSError:
            pass

    def done(self) -> bool:
        """The head is complete: stop the watch; False where it had already expired."""
        self._timer.cancel()
        with self._lock:
            self._finished = True
            return not self.expired

    def cancel(self) -> None:
        self._timer.cancel()


def send_raw(sock: socket.socket, status: int, reason: str, payload: dict, extra: bytes = b"") -> None:
    """A JSON answer written straight to the socket, then closed for writing (outside the handler's own
    response machinery: a connection over the limit, a head past its deadline)."""
    body = json.dumps(payload).encode()
    sock.settimeout(1.0)
    sock.sendall(f"HTTP/1.0 {status} {reason}\r\nContent-Type: application/json\r\n".encode() + extra +
                 b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
    sock.shutdown(socket.SHUT_WR)
