"""The skeleton of the tests' real HTTP servers (tests/reward_server.py, tests/judge_server.py): a
stdlib ThreadingHTTPServer on 127.0.0.1 at a free port, in a daemon thread, until closed; each
server's handler decides what a request gets. ``requests`` records what each POST sent."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class QuietHandler(BaseHTTPRequestHandler):
    """A handler that logs nothing, reads JSON bodies, records them and sends JSON (or any kind)."""

    def log_message(self, *args):
        pass

    def send(self, code: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def record(self, entry: tuple) -> int:
        """Appends ``entry`` to the server's requests; how many it has now."""
        with self.server.lock:
            self.server.requests.append(entry)
            return len(self.server.requests)

    def json_body(self):
        return json.loads(self.rfile.read(int(self.headers["Content-Length"])))


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        """A client that gave up (a deadline) is expected; any other error is a bug of the handler, printed
        with its traceback (the failing test shows it) and kept in ``errors``."""
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):
            return
        self.errors.append(error)
        super().handle_error(request, client_address)


class LoopbackServer:
    """Serves ``handler`` (a QuietHandler subclass) until closed."""

    handler: type[QuietHandler]

    def __init__(self):
        self.httpd = _Server(("127.0.0.1", 0), self.handler)
        self.httpd.requests, self.httpd.lock, self.httpd.errors = [], threading.Lock(), []
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def requests(self) -> list:
        return self.httpd.requests

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
