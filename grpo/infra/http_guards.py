"""The parts of a guarded server's deadlines that act on the socket itself: a watch over a request
head's whole time (``HeadWatch``) and an answer written straight to the socket (``send_raw``), for
where the handler's own response machinery cannot answer (a head cut at its deadline, a connection
over the limit). Used by grpo.infra.http."""

from __future__ import annotations

import json
import socket
import threading


class Cutoff:
    """A deadline on a socket: ``seconds`` from now, unless ``stop()`` came first, it shuts the socket
    (``how``: both ways, or only reading) so that a read or write blocked on it returns at once, and
    marks itself ``expired``. A server's whole-head deadline (``SHUT_RD``: its answer can still be
    written) and a client's whole-exchange deadline (``SHUT_RDWR``)."""

    def __init__(self, sock: socket.socket, seconds: float, how: int = socket.SHUT_RDWR):
        self.sock, self.how, self.expired, self._stopped = sock, how, False, False
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._cut)
        self._timer.daemon = True
        self._timer.start()

    def _cut(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self.expired = True
        try:
            self.sock.shutdown(self.how)
        except OSError:
            pass

    def stop(self) -> bool:
        """Stop the cut-off if it has not come, its thread gone when this returns (an exchange leaves no
        thread behind); whether it came (under the lock: no race with it)."""
        self._timer.cancel()
        with self._lock:
            self._stopped = True
            expired = self.expired
        if self._timer is not threading.current_thread():
            self._timer.join()  # cancelled: it ends at once (or after a cut already under way)
        return expired


def send_raw(sock: socket.socket, status: int, reason: str, payload: dict, extra: bytes = b"") -> None:
    """A JSON answer written straight to the socket, then closed for writing (outside the handler's own
    response machinery: a connection over the limit, a head past its deadline)."""
    body = json.dumps(payload).encode()
    sock.settimeout(1.0)
    sock.sendall(f"HTTP/1.0 {status} {reason}\r\nContent-Type: application/json\r\n".encode() + extra +
                 b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
    sock.shutdown(socket.SHUT_WR)
