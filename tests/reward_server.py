"""A real HTTP reward server for tests (stdlib http.server in a thread), speaking the protocol of
grpo/rewards/remote.py. Paths: /ok scores len(completion) + len(answer) (so the sample's fields must
arrive), /null answers null for completions 'null', /error is always a 500, /flaky a 503 on every
other request, /slow sleeps past any test deadline, /wrong returns one score too few, /notjson HTML,
/keyed a 401 unless the request carries 'Authorization: Bearer test-reward-key', /huge 100 kB of JSON."""

from __future__ import annotations

import json
import time

from tests.loopback import LoopbackServer, QuietHandler


class _Handler(QuietHandler):
    def do_POST(self):
        batch = self.json_body()
        count = self.record((self.path, batch))
        comps, samples = batch["completions"], batch["samples"]
        scores = [float(len(c) + len(str(s["answer"]))) for c, s in zip(comps, samples)]
        if self.path == "/error":
            return self.send(500, b"broken on purpose")
        if self.path == "/flaky" and count % 2 == 1:
            return self.send(503, b"try again")
        if self.path == "/slow":
            time.sleep(3.0)
        if self.path == "/wrong":
            scores = scores[:-1]
        if self.path == "/null":
            scores = [None if c == "null" else v for c, v in zip(comps, scores)]
        if self.path == "/keyed" and self.headers.get("Authorization") != "Bearer test-reward-key":
            return self.send(401, b"no key")
        if self.path == "/huge":
            return self.send(200, json.dumps({"scores": scores, "pad": "x" * 100_000}).encode())
        if self.path == "/notjson":
            return self.send(200, b"<html>hello</html>", "text/html")
        self.send(200, json.dumps({"scores": scores}).encode())


class RewardServer(LoopbackServer):
    """Serves on 127.0.0.1 at a free port until closed; ``requests`` holds (path, batch) of each POST."""

    handler = _Handler

    def url(self, path: str) -> str:
        return self.base + path
