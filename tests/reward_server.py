"""A real HTTP reward server for tests (stdlib http.server in a thread), speaking the protocol of
grpo/rewards/remote.py. Paths: /ok scores len(completion) + len(answer) (so the sample's fields must
arrive), /null answers null for completions 'null', /error is always a 500, /flaky a 503 on every
other request, /slow sleeps past any test deadline, /wrong returns one score too few, /notjson HTML,
/keyed a 401 unless the request carries 'Authorization: Bearer test-reward-key', /huge 100 kB of JSON."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def _send(self, code: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        srv = self.server
        batch = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv.requests.append((self.path, batch))
        comps, samples = batch["completions"], batch["samples"]
        scores = [float(len(c) + len(str(s["answer"]))) for c, s in zip(comps, samples)]
        if self.path == "/error":
            return self._send(500, b"broken on purpose")
        if self.path == "/flaky" and len(srv.requests) % 2 == 1:
            return self._send(503, b"try again")
        if self.path == "/slow":
            time.sleep(3.0)
        if self.path == "/wrong":
            scores = scores[:-1]
        if self.path == "/null":
            scores = [None if c == "null" else v for c, v in zip(comps, scores)]
        if self.path == "/keyed" and self.headers.get("Authorization") != "Bearer test-reward-key":
            return self._send(401, b"no key")
        if self.path == "/huge":
            return self._send(200, json.dumps({"scores": scores, "pad": "x" * 100_000}).encode())
        if self.path == "/notjson":
            return self._send(200, b"<html>hello</html>", "text/html")
        self._send(200, json.dumps({"scores": scores}).encode())


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # a client that gave up (the deadline) is expected
        pass


class RewardServer:
    """Serves on 127.0.0.1 at a free port until closed; ``requests`` holds (path, batch) of each POST."""

    def __init__(self):
        self.httpd = _Server(("127.0.0.1", 0), _Handler)
        self.httpd.requests = []
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def requests(self) -> list:
        return self.httpd.requests

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
