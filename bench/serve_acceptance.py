"""Issue 23's acceptance measurement, end to end: the embedded default run served with its base model
as fallback, against the seed's 650 ms P99 / 75% GRPO share (seed 003 section 5.3), and the untrained
model for comparison.

    python bench/serve_acceptance.py RUN_FOLDER [--requests 200] [--scaled-deadline 2.0] [--out FILE.md]

1. RUN_FOLDER without a checkpoint: trains the default run into it first (``grpo train
   output_dir=RUN_FOLDER``; about 4-5 minutes on the idle 2-core AVX2 EPYC).
2. For each (model, deadline): starts ``grpo serve MODEL --fallback base --deadline D`` on a free
   loopback port with the seed's other defaults, waits for /health, runs ``grpo serve-bench
   --concurrency 4 --requests N --prompts RUN_FOLDER`` (the run's held-out prompts), then SIGTERMs
   the server. Models: the run (its completeness check derived from its rewards: ``final_answer``
   for the default run's ``numeric``) and the untrained embedded model (fallback: itself; the same
   ``final_answer`` check given explicitly, so both are judged alike). Deadlines: the seed's 0.8 s
   and ``--scaled-deadline`` (default 2.0 s: the seed's budget is for GPU serving; on this CPU a
   longer one shows the scheme's behaviour — GRPO share and fallback reasons — rather than a wall
   of deadline misses).
3. Writes a markdown table (P50/P95/P99, throughput, GRPO share, fallback reasons, errors, engine)
   with the CPU line (``grep -o 'avx512[a-z_0-9]*' /proc/cpuinfo | sort -u``), date, commit, and the
   load average before and after each level (a shared machine shows there), plus the raw JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

UNTRAINED = "embedded:SmolLM2-135M-Instruct"
ROOT = Path(__file__).resolve().parents[1]


def sh(cmd: str) -> str:
    return subprocess.run(cmd, shell=True, capture_output=True, text=True, cwd=ROOT).stdout.strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}


def grpo(*args: str) -> list[str]:
    return [sys.executable, "-m", "grpo", *args]


def ensure_trained(run: Path) -> None:
    if (run / "checkpoints").is_dir() and any((run / "checkpoints").glob("step-*")):
        return
    print(f"{run}: no checkpoint; training the default run into it (about 4-5 min on an idle 2-core CPU)", flush=True)
    t0 = time.time()
    subprocess.run(grpo("train", f"output_dir={run}"), check=True, cwd=ROOT, env=ENV)
    print(f"trained in {time.time() - t0:.0f} s", flush=True)


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float) -> None:
    import httpx

    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise SystemExit(f"grpo serve exited with {proc.returncode} before it was healthy")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit(f"grpo serve not healthy within {timeout:.0f} s")


def level(model: str, run: Path, deadline: float, requests: int, extra: list[str], logdir: Path) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    tag = f"{'run' if model != UNTRAINED else 'untrained'}_d{deadline}"
    log = open(logdir / f"serve_{tag}.log", "w")
    proc = subprocess.Popen(grpo("serve", model, "--fallback", "base", "--port", str(port), "--deadline", str(deadline),
                                 *extra), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=ENV)
    try:
        wait_healthy(url, proc, 900)
        load0 = open("/proc/loadavg").read().split()[:3]
        out = logdir / f"bench_{tag}.json"
        t0 = time.time()
        subprocess.run(grpo("serve-bench", "--url", url, "--concurrency", "4", "--requests", str(requests),
                            "--prompts", str(run), "--out", str(out)), check=True, cwd=ROOT, env=ENV)
        seconds = time.time() - t0
        load1 = open("/proc/loadavg").read().split()[:3]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        log.close()
    text = (logdir / f"serve_{tag}.log").read_text()
    engine = re.search(r"\(engine (\w+); completeness check (\w+)", text)
    res = json.loads(out.read_text())["levels"][0]
    return {"model": model, "deadline": deadline, "engine": engine.group(1) if engine else "?",
            "check": engine.group(2) if engine else "?", "load": f"{'/'.join(load0)} -> {'/'.join(load1)}",
            "bench_s": round(seconds, 1), **res}


def table(rows: list[dict], requests: int) -> str:
    ms = lambda v: "-" if v is None else f"{v / 1000:.2f} s" if v >= 1000 else f"{v:.0f} ms"  # noqa: E731
    head = ("| model (fallback: its base) | deadline | engine | check | ok / sent | P50 | P95 | P99 | req/s | "
            "GRPO share | fallback reasons | errors | mean tokens (grpo / base) | load avg before -> after |\n" + "|---" * 14 + "|\n")
    lines = []
    for r in rows:
        name = "untrained SmolLM2-135M-Instruct (itself)" if r["model"] == UNTRAINED else f"trained run `{r['model']}`"
        share = "-" if r["grpo_share"] is None else f"{r['grpo_share']:.0%}"
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(r["fallback_reasons"].items())) or "-"
        errors = ", ".join(f"{k} {v}" for k, v in sorted(r["errors"].items())) or "-"
        toks = " / ".join(str(r.get("mean_tokens", {}).get(k, "-")) for k in ("grpo", "base"))
        lines.append(f"| {name} | {r['deadline']} s | {r['engine']} | {r['check']} | {r['ok']} / {requests} | "
                     f"{ms(r['p50_ms'])} | {ms(r['p95_ms'])} | {ms(r['p99_ms'])} | {r['throughput_rps']} | {share} | "
                     f"{reasons} | {errors} | {toks} | {r['load']} |")
    return head + "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="the trained run folder (trained here first if it has no checkpoint)")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--scaled-deadline", type=float, default=2.0, help="the extra level's deadline (0: none)")
    ap.add_argument("--out", type=Path, help="markdown file (default: RUN/serve_acceptance.md)")
    args = ap.parse_args()
    run = args.run.resolve()
    ensure_trained(run)
    logdir = run / "serve_acceptance"
    logdir.mkdir(exist_ok=True)
    cpu = sh("grep -o 'avx512[a-z_0-9]*' /proc/cpuinfo | sort -u") or "(none: AVX2)"
    model_name = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2")
    commit = sh("git rev-parse --short HEAD") + (" (+ uncommitted changes)" if sh("git status --porcelain -uno") else "")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    deadlines = [0.8] + ([args.scaled_deadline] if args.scaled_deadline > 0 else [])
    rows, out = [], args.out or run / "serve_acceptance.md"
    for d in deadlines:
        for model, extra in ((str(run), []), (UNTRAINED, ["--completeness", "final_answer"])):
            print(f"== {model}, deadline {d} s, {args.requests} requests at concurrency 4", flush=True)
            rows.append(level(model, run, d, args.requests, extra, logdir))
            md = (f"Serving acceptance (issue 23; seed 003 section 5.3 targets: P99 <= 650 ms, GRPO share >= 75%), "
                  f"`grpo serve-bench --concurrency 4 --requests {args.requests}` on the run's held-out prompts, "
                  f"the seed's scheme defaults except the deadline shown; {started}, commit {commit}; "
                  f"CPU {model_name}, {os.cpu_count()} cores, AVX-512 flags: {cpu}.\n\n" + table(rows, args.requests))
            out.write_text(md)  # after every level: an interrupted measurement keeps what it made
            (logdir / "rows.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(md)
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
