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
--port 8765 --api-key KEY [--slots N]`` (it grades in its own bubblewrap sandbox, up to its cores; the
key may come from ``$GRPO_CODE_GRADER_KEY``; a non-loopback bind without a key is refused unless
``--insecure``). Point the trainer at them with ``GRPO_CODE_GRADER_URL=http://host1:8765,http://host2:8765``
(and the same ``GRPO_CODE_GRADER_KEY``): the batched code rewards (``code``, ``code_strict``,
``code_generated``, what the trainer runs) then split each step's completions into contiguous shares,
one per service, sent concurrently. The service bounds what it takes (``--max-request-bytes``,
``--max-completions`` and ``--max-tests`` per request: 413; ``--max-concurrent`` requests grading at
once: 429) and every request (grpo.infra.http). A share's client deadline is proportional to its work:
``GRPO_CODE_GRADER_TIMEOUT`` (default 30 s) plus twice the share's sandbox seconds at most (each
program's tests up to its time limit) over the service's slots (``share_deadline``); a 429 is retried
within it. A service that fails or passes it fails its share's rewards (counted, logged), not the run.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import time
from dataclasses import dataclass

from grpo.errors import SandboxError
from grpo.infra.http import Gate, GuardedServer, HttpError, HttpLimits, Route, add_server_flags, limits_of, parse_json
from grpo.infra.http_client import bearer, exchange
from grpo.infra.process_cache import ProcessCache
from grpo.rewards.code import CodeGrader, grade_batch

VERSION = 1
KEY_ENV = "GRPO_CODE_GRADER_KEY"
SERVICES = ProcessCache("each grading service's /health answer (slots, time limits), by URL",
                        stale_when="the service restarts with other limits: check_remote() reads every service again")


def remote_urls() -> list[str]:
    """The grading services named by GRPO_CODE_GRADER_URL (comma-separated), none by default."""
    return [u.strip().rstrip("/") for u in os.environ.get("GRPO_CODE_GRADER_URL", "").split(",") if u.strip()]


def _base_timeout() -> float:
    return float(os.environ.get("GRPO_CODE_GRADER_TIMEOUT", "30"))


def _health(url: str) -> dict:
    health = SERVICES.get(url)
    if health is None:  # read outside the cache's lock: the services of a step are asked concurrently
        health = SERVICES[url] = _read_health(url)
    return health


def _read_health(url: str) -> dict:
    r = exchange(url + "/health", method="GET", headers=bearer(os.environ.get(KEY_ENV)), deadline_s=30.0,
                 max_reply_bytes=1 << 16)
    if r.status != 200:
        hint = f" (set ${KEY_ENV} to the service's key)" if r.status == 401 else ""
        raise ValueError(f"/health answered HTTP {r.status}{hint}")
    health = json.loads(r.body)
    if health.get("version") != VERSION or not health.get("ok"):
        raise ValueError(f"unexpected answer {health}")
    return health


def share_deadline(samples: list[dict], health: dict, base: float) -> float:
    """Seconds a service may take for ``samples``: ``base`` plus twice their sandbox seconds at most
    (a program's tests each within the per-test limit, all within the program's) over its slots."""
    test_s, program_s = float(health.get("test_seconds", 5.0)), float(health.get("program_seconds", 8.0))
    work = sum(min(len(s.get("tests") or s.get("io") or []) * test_s, program_s) for s in samples)
    return base + 2.0 * work / max(1, int(health.get("slots", 1)))


def _post(url: str, payload: dict) -> dict:
    """One share graded at ``url`` within its deadline (a 429, the service busy, retried inside it)."""
    deadline = share_deadline(payload["samples"], _health(url), _base_timeout())
    body, end = json.dumps(payload).encode(), time.monotonic() + deadline
    headers = {"Content-Type": "application/json", **bearer(os.environ.get(KEY_ENV))}
    while True:
        left = end - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{url}: busy (429) for the share's whole {deadline:.0f} s deadline")
        r = exchange(url + "/grade", body=body, headers=headers, deadline_s=left, max_reply_bytes=16 << 20)
        if r.status == 429:
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))
            continue
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.body[:300].decode(errors='replace')}")
        return json.loads(r.body)


def check_remote() -> None:
    """Every configured service answers /health (with the key); else SandboxError naming it."""
    for url in remote_urls():
        SERVICES.pop(url, None)
        try:
            _health(url)
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


@dataclass
class GradingLimits:
    """What one /grade request may ask (413 past them) and how many grade at once (429 past it)."""

    max_completions: int = 1024
    max_tests: int = 16384
    max_concurrent: int = 4


def grade_request(raw: bytes, limits: GradingLimits, max_depth: int) -> tuple[list[str], list[dict], bool]:
    """The checked body of a /grade request; HttpError naming the field."""
    req = parse_json(raw, max_depth=max_depth)
    completions, samples, strict = req.get("completions"), req.get("samples"), req.get("strict", False)
    if not isinstance(completions, list) or not all(isinstance(c, str) for c in completions):
        raise HttpError(400, "completions", "completions: a list of strings expected")
    if not isinstance(samples, list) or len(samples) != len(completions):
        raise HttpError(400, "samples", f"samples: a list of {len(completions)} objects (one per completion) expected")
    if len(completions) > limits.max_completions:
        raise HttpError(413, "completions", f"completions: {len(completions)}, over the limit of "
                        f"{limits.max_completions} (--max-completions)")
    tests = 0
    for i, smp in enumerate(samples):
        if not isinstance(smp, dict):
            raise HttpError(400, f"samples[{i}]", f"samples[{i}]: an object expected, got {type(smp).__name__}")
        for key in ("tests", "io"):
            if key in smp and not isinstance(smp[key], list):
                raise HttpError(400, f"samples[{i}].{key}", f"samples[{i}].{key}: a list expected")
            tests += len(smp.get(key) or [])
    if tests > limits.max_tests:
        raise HttpError(413, "samples", f"samples: {tests} tests, over the limit of {limits.max_tests} (--max-tests)")
    if not isinstance(strict, bool):
        raise HttpError(400, "strict", f"strict: true or false expected, got {type(strict).__name__}")
    return completions, samples, strict


def make_server(host: str, port: int, grader, *, api_key: str | None = None, http: HttpLimits | None = None,
                limits: GradingLimits | None = None) -> GuardedServer:
    """A grading service on ``grader`` (a checked CodeGrader); ``serve_forever`` to run it."""
    http, limits = http or HttpLimits(max_body_bytes=64 << 20), limits or GradingLimits()
    health = {"ok": True, "slots": grader.slots, "version": VERSION, "test_seconds": grader.test_timeout,
              "program_seconds": grader.program_timeout, "max_completions": limits.max_completions}

    def grade(raw: bytes, _kind: str) -> dict:
        completions, samples, strict = grade_request(raw, limits, http.max_json_depth)
        t0 = time.perf_counter()
        outs = grade_batch(grader, completions, samples, strict=strict)
        return {"scores": [None if isinstance(o, BaseException) else o for o in outs],
                "errors": [f"{type(o).__name__}: {o}" if isinstance(o, BaseException) else None for o in outs],
                "seconds": time.perf_counter() - t0}

    routes = {("GET", "/health"): Route(lambda raw, kind: health),
              ("POST", "/grade"): Route(grade, gate=Gate(limits.max_concurrent, "grading requests"))}
    return GuardedServer((host, port), routes, api_key=api_key, limits=http)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Serve the sandboxed code grader over HTTP (see module doc).")
    ap.add_argument("--slots", type=int, default=0, help="concurrent sandbox runs (0 = this machine's cores)")
    ap.add_argument("--max-completions", type=int, default=1024, help="completions in one request (413 past it)")
    ap.add_argument("--max-tests", type=int, default=16384, help="tests in one request (413 past it)")
    ap.add_argument("--max-concurrent", type=int, default=4, help="requests grading at once (429 past it)")
    add_server_flags(ap, port=8765, env=KEY_ENV, max_body_bytes=64 << 20)
    args = ap.parse_args(argv)
    http = limits_of(args, env=KEY_ENV)
    grader = CodeGrader(slots=args.slots or None)
    grader.check()
    server = make_server(args.host, args.port, grader, api_key=args.api_key, http=http, limits=GradingLimits(
        max_completions=args.max_completions, max_tests=args.max_tests, max_concurrent=args.max_concurrent))
    print(f"grading service on http://{args.host}:{server.server_address[1]} ({grader.slots} slots"
          f"{'; key required' if args.api_key else ''})", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    try:
        main()
    except (SandboxError, ValueError) as e:  # a bad flag, an unkeyed public bind, no sandbox: one line
        raise SystemExit(f"grading service: error: {e}") from None
