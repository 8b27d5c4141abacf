"""Grading code beyond one machine: a small HTTP grading service and the client the code rewards use.

Interface (JSON over HTTP, version 1):
- ``GET /health`` -> ``{"ok": true, "slots": <concurrent sandbox runs>, "version": 1}``; answers only
  once the service's sandbox passed its check.
- ``POST /grade`` with ``{"completions": [str, ...], "samples": [{"tests": [...]} | {"io": [...]}, ...],
  "strict": bool}`` -> ``{"scores": [float | null, ...], "errors": [str | null, ...], "seconds": float}``:
  one score per completion (the share of tests passed, or 1.0/0.0 when strict), null with the error
  where grading that sample raised (a malformed test); ``seconds``: the service's grading wall time.
  A sample needs only its ``tests`` / ``io`` (no prompt or answer is sent).

Run a service on each grading machine: ``python -m grpo.rewards.grading_service --host 0.0.0.0
--port 8765 [--slots N]`` (it grades in its own bubblewrap sandbox, up to its cores). Point the
trainer at them with ``GRPO_CODE_GRADER_URL=http://host1:8765,http://host2:8765``: the batched code
rewards (``code``, ``code_strict``, ``code_generated``, what the trainer runs) then split each step's
completions into contiguous shares, one per service, sent concurrently. The service has no
authentication: bind it to a private network only. A service that fails or does not answer in
``GRPO_CODE_GRADER_TIMEOUT`` seconds (default 600) fails its share's rewards (counted, logged), not the run.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from grpo.errors import SandboxError

VERSION = 1


def remote_urls() -> list[str]:
    """The grading services named by GRPO_CODE_GRADER_URL (comma-separated), none by default."""
    return [u.strip().rstrip("/") for u in os.environ.get("GRPO_CODE_GRADER_URL", "").split(",") if u.strip()]


def _timeout() -> float:
    return float(os.environ.get("GRPO_CODE_GRADER_TIMEOUT", "600"))


def _post(url: str, payload: dict) -> dict:
    req = urllib.request.Request(url + "/grade", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=_timeout()) as resp:
        return json.loads(resp.read())


def check_remote() -> None:
    """Every configured service answers /health; else SandboxError naming it."""
    for url in remote_urls():
        try:
            with urllib.request.urlopen(url + "/health", timeout=30) as resp:
                health = json.loads(resp.read())
            if health.get("version") != VERSION or not health.get("ok"):
                raise ValueError(f"unexpected answer {health}")
        except Exception as e:
            raise SandboxError(f"GRPO_CODE_GRADER_URL: the grading service {url} is not usable ({e}); start "
                               f"it with python -m grpo.rewards.grading_service, or unset the variable") from None


def grade_remotely(completions: list[str], samples: list[dict], *, strict: bool) -> list:
    """Scores (or the exception, per completion) from the configured services, one contiguous share each."""
    urls = remote_urls()
    n = len(completions)
    shares = [(i * n // len(urls), (i + 1) * n // len(urls)) for i in range(len(urls))]

    def one(url, lo, hi) -> list:
        if lo == hi:
            return []
        try:
            got = _post(url, {"completions": completions[lo:hi], "strict": strict,
                              "samples": [{k: s[k] for k in ("tests", "io") if k in s} for s in samples[lo:hi]]})
            if len(got["scores"]) != hi - lo:
                raise ValueError(f"{len(got['scores'])} scores for {hi - lo} completions")
            return [float(x) if x is not None else ValueError(f"grading service {url}: {e}")
                    for x, e in zip(got["scores"], got["errors"])]
        except Exception as e:  # the share fails; the other services' shares stand
            return [RuntimeError(f"grading service {url} failed: {type(e).__name__}: {e}")] * (hi - lo)

    with cf.ThreadPoolExecutor(len(urls)) as ex:
        parts = list(ex.map(lambda a: one(*a), [(u, lo, hi) for u, (lo, hi) in zip(urls, shares)]))
    return [x for part in parts for x in part]


def make_server(host: str, port: int, grader) -> ThreadingHTTPServer:
    """A grading service on ``grader`` (a checked CodeGrader); ``serve_forever`` to run it."""
    from grpo.rewards.code import _grade_batch_local

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                self._send(200, {"ok": True, "slots": grader.slots, "version": VERSION})
            else:
                self._send(404, {"error": "unknown path"})

        def do_POST(self):
            if self.path != "/grade":
                return self._send(404, {"error": "unknown path"})
            try:
                req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                completions, samples = list(req["completions"]), list(req["samples"])
                if len(completions) != len(samples) or not all(isinstance(c, str) for c in completions):
                    raise ValueError("completions (strings) and samples must be lists of one length")
            except Exception as e:
                return self._send(400, {"error": f"bad request: {e}"})
            t0 = time.perf_counter()
            outs = _grade_batch_local(grader, completions, samples, strict=bool(req.get("strict")))
            self._send(200, {"scores": [None if isinstance(o, BaseException) else o for o in outs],
                             "errors": [f"{type(o).__name__}: {o}" if isinstance(o, BaseException) else None
                                        for o in outs], "seconds": time.perf_counter() - t0})

        def log_message(self, *args):  # quiet: one line per request would flood a training log
            pass

    return ThreadingHTTPServer((host, port), Handler)


def main(argv: list[str] | None = None) -> None:
    from grpo.rewards.code import CodeGrader

    ap = argparse.ArgumentParser(description="Serve the sandboxed code grader over HTTP (see module doc).")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--slots", type=int, default=0, help="concurrent sandbox runs (0 = this machine's cores)")
    args = ap.parse_args(argv)
    grader = CodeGrader(slots=args.slots or None)
    grader.check()
    server = make_server(args.host, args.port, grader)
    print(f"grading service on http://{args.host}:{server.server_address[1]} ({grader.slots} slots)", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
