"""A real loopback HTTP server speaking OpenAI's chat API (stdlib http.server in a thread), standing in
for a judge model with a rule a test can predict: in the judge's default templates it reads the
reference answer and each reply, and answers 'yes' / 'no' (pointwise) or 'i: 10' / 'i: 0' per numbered
reply (group), by the reply's last number. Paths (before /v1/chat/completions): /ok, /slow (sleeps past
any test deadline), /flaky (a 503 on every other request), /keyed (a 401 unless 'Authorization: Bearer
test-judge-key'), /garbled (answers 'maybe')."""

from __future__ import annotations

import json
import re
import time

from tests.loopback import LoopbackServer, QuietHandler


def _last_number(text: str) -> str | None:
    found = re.findall(r"-?\d+", text)
    return found[-1] if found else None


def judge_reply(content: str) -> str:
    """What this judge answers to a user message built from the default templates."""
    gold = re.search(r"Reference answer: (.*)", content).group(1).strip()
    if "Student's reply:" in content:
        reply = content.split("Student's reply:", 1)[1].split("\n\nIs the student's", 1)[0]
        return "yes" if _last_number(reply) == gold else "no"
    replies = content.split("Replies:\n", 1)[1].split("\n\nScore each", 1)[0]
    lines = re.findall(r"(?m)^(\d+): (.*)$", replies)
    return "\n".join(f"{i}: {10 if _last_number(text) == gold else 0}" for i, text in lines)


class _Handler(QuietHandler):
    def do_POST(self):
        body = self.json_body()
        count = self.record((self.path, body, self.headers.get("Authorization")))
        route = self.path.removesuffix("/v1/chat/completions")
        if not self.path.endswith("/v1/chat/completions"):
            return self.send(404, b'{"error": {"message": "no such route"}}')
        if route == "/flaky" and count % 2 == 1:
            return self.send(503, b'{"error": {"message": "busy"}}')
        if route == "/slow":
            time.sleep(3.0)
        if route == "/keyed" and self.headers.get("Authorization") != "Bearer test-judge-key":
            return self.send(401, b'{"error": {"message": "no key"}}')
        text = "maybe" if route == "/garbled" else judge_reply(body["messages"][-1]["content"])
        answer = {"id": "x", "object": "chat.completion", "model": body.get("model", "judge"),
                  "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                               "finish_reason": "stop"}]}
        self.send(200, json.dumps(answer).encode())


class JudgeServer(LoopbackServer):
    """Serves on 127.0.0.1 at a free port until closed; ``requests`` holds (path, body, Authorization)."""

    handler = _Handler

    def url(self, route: str) -> str:
        return f"{self.base}{route}/v1"
