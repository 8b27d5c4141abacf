"""``grpo serve-bench``: a bounded load test of a running ``grpo serve`` over HTTP (httpx).

At each concurrency level, that many clients send chat requests for held-out prompts, one after
another, until ``--requests`` were answered or failed; then the next level. Reported per level:
latency percentiles (nearest rank), throughput, the share answered by the GRPO model, the fallback
reasons and the errors. It stops by itself: every request has a timeout, and the count is fixed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in (0, 100]) of a non-empty list."""
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


@dataclass
class LevelResult:
    concurrency: int
    requests: int
    ok: int
    seconds: float
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    throughput_rps: float
    grpo_share: float | None
    fallback_reasons: dict = field(default_factory=dict)
    errors: dict = field(default_factory=dict)
    mean_tokens: dict = field(default_factory=dict)  # answering model -> mean completion tokens of its answers


def held_out_prompts(source: str) -> list[str]:
    """The held-out prompts of a run's task (a run folder) or of a task name, as the trainer holds
    them out (its eval_prompts, with the config's defaults)."""
    from grpo.config.io import load_config
    from grpo.data.tasks import task_of

    p = Path(source)
    cfg = load_config(p / "config.yaml") if (p / "config.yaml").is_file() else load_config(None, [f"task={source}"])
    prompts = [s["prompt"] for s in task_of(cfg).eval]
    return [p if isinstance(p, str) else p[-1]["content"] for p in prompts]


async def run_level(url: str, prompts: list[str], *, concurrency: int, requests: int, model: str,
                    max_tokens: int | None, api_key: str | None, timeout: float) -> LevelResult:
    import httpx

    latencies, answered, reasons, errors, tokens = [], Counter(), Counter(), Counter(), Counter()
    counter = iter(range(requests))
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def client(http):
        for i in counter:
            body = {"model": model, "messages": [{"role": "user", "content": prompts[i % len(prompts)]}]}
            if max_tokens:
                body["max_tokens"] = max_tokens
            t0 = time.perf_counter()
            try:
                r = await http.post(f"{url}/v1/chat/completions", json=body, headers=headers)
            except httpx.HTTPError as e:
                errors[type(e).__name__] += 1
                continue
            if r.status_code != 200:
                errors[str(r.status_code)] += 1
                continue
            latencies.append(time.perf_counter() - t0)
            by = r.headers.get("x-grpo-answered-by", "?")
            answered[by] += 1
            tokens[by] += (r.json().get("usage") or {}).get("completion_tokens", 0)
            if by != "grpo":
                reasons[r.headers.get("x-grpo-reason", "?")] += 1

    start = time.perf_counter()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as http:
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
    seconds = time.perf_counter() - start
    ok = len(latencies)
    pct = (lambda q: round(percentile(latencies, q) * 1000, 1)) if ok else (lambda q: None)
    return LevelResult(concurrency, requests, ok, round(seconds, 2), pct(50), pct(95), pct(99), round(ok / seconds, 2),
                       answered["grpo"] / ok if ok else None, dict(reasons), dict(errors),
                       {k: round(tokens[k] / n, 1) for k, n in answered.items()})


def bench_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="grpo serve-bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--concurrency", default="1,4,16", help="comma-separated client counts, run in turn")
    ap.add_argument("--requests", type=int, default=200, help="requests per concurrency level")
    ap.add_argument("--prompts", default="arithmetic",
                    help="a run folder (its task's held-out prompts) or a task name")
    ap.add_argument("--model", default="grpo", help="grpo (the scheme) or base (the fallback alone)")
    ap.add_argument("--max-tokens", type=int)
    ap.add_argument("--api-key")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    ap.add_argument("--out", type=Path, help="write the results as JSON")
    args = ap.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if not levels or min(levels) < 1 or args.requests < 1:
        raise SystemExit("grpo serve-bench: --concurrency needs counts >= 1 and --requests >= 1")
    prompts = held_out_prompts(args.prompts)
    results = []
    print(f"{'conc':>4} {'ok':>5} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'req/s':>6} {'grpo':>6}  fallbacks / errors"
          " / mean tokens by model")
    for c in levels:
        r = asyncio.run(run_level(args.url, prompts, concurrency=c, requests=args.requests, model=args.model,
                                  max_tokens=args.max_tokens, api_key=args.api_key, timeout=args.timeout))
        results.append(asdict(r))
        share = "-" if r.grpo_share is None else f"{r.grpo_share:.0%}"
        print(f"{c:>4} {r.ok:>5} {r.p50_ms!s:>8} {r.p95_ms!s:>8} {r.p99_ms!s:>8} {r.throughput_rps:>6} {share:>6}  "
              f"{r.fallback_reasons} / {r.errors} / {r.mean_tokens}", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"url": args.url, "prompts": args.prompts, "levels": results}, indent=2) + "\n")
    return 0
