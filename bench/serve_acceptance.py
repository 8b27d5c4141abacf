"""Every serving acceptance figure in one run, with the CPU line: the seed's scheme (P99 <= 650 ms with
>= 75% of requests answered by the GRPO model) at concurrency 4, a single request's latency at
concurrency 1, and throughput at concurrency 16 against vLLM's own OpenAI server.

    python bench/serve_acceptance.py RUN_FOLDER [--requests 200] [--vllm PATH] [--out FILE.md]

1. RUN_FOLDER without a checkpoint: trains the default run into it first (``grpo train
   output_dir=RUN_FOLDER``: the embedded SmolLM2-135M-Instruct on arithmetic, 25 steps).
2. The kernel choices are measured afresh on this machine (a cache folder of this measurement's own,
   ``$GRPO_CACHE``), not read from a cache another load made.
3. c=4: ``grpo serve RUN --fallback base`` with the seed's defaults (0.8 s deadline, 512 / 1024 token
   caps, the entropy stop), ``grpo serve-bench --concurrency 4 --requests N`` on the run's held-out
   prompts; then the untrained model (fallback: itself) under the same check (``final_answer``).
4. c=1: the first held-out prompt whose trained answer is 8 tokens, sent ``--c1-requests`` times one
   after another to the trained run's server: P50 to the answer's last token (the whole response).
5. c=16: the trained run's server against ``vllm serve`` on the run exported as a plain model
   folder (``grpo export``), the same held-out prompts, greedy, the GRPO model's token cap, in the
   same serve-bench run: throughput (answered requests/s) and P99 of both; then ``grpo serve`` on the
   exported model alone as vLLM runs it (no deadline, no entropy stop, every answer accepted: no
   fallback work), the engines like for like. Needs vLLM's environment
   (``--vllm``: its Python or its ``vllm`` command; default: .venv-vllm/bin/vllm of this checkout, whose
   Python starts the server); without it the row says so.
6. Writes a markdown table per part with the CPU line (bench/machine.py), date, commit and the load
   average before and after each level, to RUN/serve_acceptance.md, and the raw JSON beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.machine import commit, cpu_line  # noqa: E402
from grpo.serve.bench import free_port, wait_healthy  # noqa: E402
from grpo.serve.scheme import DEFAULT_ENTROPY_THRESHOLD  # noqa: E402

UNTRAINED = "embedded:SmolLM2-135M-Instruct"


def load() -> str:
    return "/".join(open("/proc/loadavg").read().split()[:3])


class Served:
    """``grpo serve`` in a subprocess on a free port, until ``stop``."""

    def __init__(self, model: str, extra: list[str], log: Path, env: dict):
        self.url = f"http://127.0.0.1:{(port := free_port())}"
        self.log = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "grpo", "serve", model, "--port", str(port), *extra],
                                     stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        if not wait_healthy(self.url, self.proc, timeout=1800, name="grpo serve", log=str(log)):
            self.stop()
            raise SystemExit(f"grpo serve not healthy within 30 min (log: {log})")
        text = log.read_text()
        m = re.search(r"\(engine (\w+); completeness check (\w+)", text)
        self.engine, self.check = (m.group(1), m.group(2)) if m else ("?", "?")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=300)
        self.log.close()


def bench(url: str, out: Path, env: dict, *args: str) -> tuple[list[dict], str, str]:
    """``grpo serve-bench`` against ``url``: its levels, and the load average before and after."""
    before = load()
    subprocess.run([sys.executable, "-m", "grpo", "serve-bench", "--url", url, "--out", str(out), *args], check=True,
                   cwd=ROOT, env=env)
    return json.loads(out.read_text())["levels"], before, load()


def ms(v) -> str:
    return "-" if v is None else f"{v / 1000:.2f} s" if v >= 1000 else f"{v:.0f} ms"


def c4_table(rows: list[dict], requests: int) -> str:
    head = ("| model (fallback) | engine | check | ok / sent | P50 | P95 | P99 | req/s | GRPO share | fallback reasons "
            "| errors | mean tokens (grpo / base) | load before -> after |\n" + "|---" * 13 + "|\n")
    out = []
    for r in rows:
        share = "-" if r["grpo_share"] is None else f"{r['grpo_share']:.1%}"
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(r["fallback_reasons"].items())) or "-"
        errors = ", ".join(f"{k} {v}" for k, v in sorted(r["errors"].items())) or "-"
        toks = " / ".join(str(r["mean_tokens"].get(k, "-")) for k in ("grpo", "base"))
        out.append(f"| {r['name']} | {r['engine']} | {r['check']} | {r['ok']} / {requests} | {ms(r['p50_ms'])} | "
                   f"{ms(r['p95_ms'])} | {ms(r['p99_ms'])} | {r['throughput_rps']} | {share} | {reasons} | {errors} | "
                   f"{toks} | {r['load']} |")
    return head + "\n".join(out) + "\n"


def eight_token_prompt(url: str, prompts: list[str]) -> tuple[str, int] | None:
    """The first held-out prompt the GRPO model answers (itself, complete) in 8 tokens."""
    import httpx

    best = None
    for p in prompts[:100]:
        r = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
            "model": "grpo", "temperature": 0.0, "messages": [{"role": "user", "content": p}]}).json()
        n = r["usage"]["completion_tokens"]
        if r.get("answered_by") == "grpo" and n == 8:
            return p, n
        if r.get("answered_by") == "grpo" and (best is None or abs(n - 8) < abs(best[1] - 8)):
            best = (p, n)
    return best  # None: no held-out prompt was answered by the GRPO model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="the trained run folder (trained here first if it has no checkpoint)")
    ap.add_argument("--requests", type=int, default=200, help="requests per level at c=4 and c=16")
    ap.add_argument("--c1-requests", type=int, default=50)
    ap.add_argument("--vllm", type=Path, default=ROOT / ".venv-vllm" / "bin" / "vllm", help="vLLM's environment: its Python or its vllm command")
    ap.add_argument("--out", type=Path, help="markdown file (default: RUN/serve_acceptance.md)")
    ap.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                    help="an argument for both grpo serve processes (repeatable), e.g. --serve-arg=--dtype=auto")
    args = ap.parse_args()
    run = args.run.resolve()
    logdir = run / "serve_acceptance"
    logdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
           "GRPO_CACHE": str(logdir / "cache")}  # kernels measured now, on this machine as it is
    t0 = time.monotonic()
    if not any((run / "checkpoints").glob("step-*")):
        print(f"{run}: no checkpoint; training the default run into it", flush=True)
        subprocess.run([sys.executable, "-m", "grpo", "train", f"output_dir={run}"], check=True, cwd=ROOT, env=env)
    trained_s, t0 = time.monotonic() - t0, time.monotonic()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    head = (f"Serving acceptance, {started}, commit {commit()}; CPU: {cpu_line()}; torch threads: the default; "
            f"load average at the start {load()}. Scheme: the seed's defaults (0.8 s deadline, 512 / 1024 token caps, "
            f"entropy stop 3 tokens below {DEFAULT_ENTROPY_THRESHOLD} nats), greedy"
            + (f"; grpo serve {' '.join(args.serve_arg)}" if args.serve_arg else "") + ".\n\n")
    out = args.out or run / "serve_acceptance.md"
    doc, raw = [head], {}

    def write():
        out.write_text("".join(doc))
        (logdir / "results.json").write_text(json.dumps(raw, indent=2) + "\n")

    from grpo.serve.bench import held_out_prompts

    prompts = held_out_prompts(str(run))
    # c=4 (and c=1, c=16 on the same trained server)
    c4 = []
    trained = Served(str(run), ["--fallback", "base", *args.serve_arg], logdir / "serve_trained.log", env)
    try:
        levels, b, a = bench(trained.url, logdir / "c4_trained.json", env, "--concurrency", "4", "--requests",
                             str(args.requests), "--prompts", str(run))
        c4.append({"name": "trained default run (its base)", "engine": trained.engine, "check": trained.check,
                   "load": f"{b} -> {a}", **levels[0]})
        found = eight_token_prompt(trained.url, prompts)
        if found is not None:
            levels, b, a = bench(trained.url, logdir / "c1.json", env, "--concurrency", "1", "--requests",
                                 str(args.c1_requests), "--prompt", found[0])
            raw["c1"] = {"prompt": found[0], "tokens": found[1], "load": f"{b} -> {a}", **levels[0]}
        else:
            raw["c1"] = None
        write()
        export = logdir / "export"
        if not (export / "config.json").is_file():
            subprocess.run([sys.executable, "-m", "grpo", "export", str(run), "--out", str(export)], check=True,
                           cwd=ROOT, env=env)
        dtype = next((a.split("=", 1)[1] for a in args.serve_arg if a.startswith("--dtype=")), "float32")
        vllm_args = ["--vllm-model", str(export), "--vllm", str(args.vllm),
                     "--vllm-dtype", "bfloat16" if dtype == "bfloat16" else "float32"] if args.vllm.is_file() else []
        levels, b, a = bench(trained.url, logdir / "c16.json", env, "--concurrency", "16", "--requests",
                             str(args.requests), "--prompts", str(run), *vllm_args)
        raw["c16"] = {"load": f"{b} -> {a}", "levels": levels, "vllm": str(args.vllm) if vllm_args else None}
        write()
    finally:
        trained.stop()
    # the engines like for like: the exported model alone, as vllm serve runs it (no deadline, no entropy
    # stop, every answer accepted), so the fallback's work does not count against grpo's engine
    alone = Served(str(export), ["--deadline", "60", "--entropy-run", "0", "--completeness", "markers",
                                 "--closing-markers", "none", *args.serve_arg], logdir / "serve_alone.log", env)
    try:
        levels, b, a = bench(alone.url, logdir / "c16_alone.json", env, "--concurrency", "16", "--requests",
                             str(args.requests), "--prompts", str(run))
        raw["c16"]["levels"].append({**levels[0], "server": "grpo serve, the model alone", "load": f"{b} -> {a}"})
        write()
    finally:
        alone.stop()
    untrained = Served(UNTRAINED, ["--fallback", "base", "--completeness", "final_answer", *args.serve_arg],
                       logdir / "serve_untrained.log", env)
    try:
        levels, b, a = bench(untrained.url, logdir / "c4_untrained.json", env, "--concurrency", "4", "--requests",
                             str(args.requests), "--prompts", str(run))
        c4.append({"name": "untrained SmolLM2-135M-Instruct (itself)", "engine": untrained.engine,
                   "check": untrained.check, "load": f"{b} -> {a}", **levels[0]})
    finally:
        untrained.stop()
    raw["c4"] = c4
    doc.append(f"**c=4**, {args.requests} held-out prompts (target: P99 <= 650 ms, GRPO share >= 75%):\n\n"
               + c4_table(c4, args.requests) + "\n")
    c1 = raw["c1"]
    if c1 is None:
        doc.append("**c=1**: not measured: none of the first 100 held-out prompts was answered by the GRPO model.\n\n")
    else:
        doc.append(f"**c=1**, one held-out prompt ({c1['prompt']!r}, a {c1['tokens']}-token answer), {c1['ok']} "
                   f"requests one after another (target: P50 <= 200 ms to the last token): P50 {ms(c1['p50_ms'])}, "
                   f"P95 {ms(c1['p95_ms'])}, P99 {ms(c1['p99_ms'])}; GRPO share {c1['grpo_share']:.0%}; "
                   f"load {c1['load']}.\n\n")
    lines = ["| server | ok / sent | P50 | P99 | req/s | GRPO share | mean tokens |", "|---|---|---|---|---|---|---|"]
    for lv in raw["c16"]["levels"]:
        share = "-" if lv["server"] != "grpo serve" or lv["grpo_share"] is None else f"{lv['grpo_share']:.1%}"
        lines.append(f"| {lv['server']} | {lv['ok']} / {args.requests} | {ms(lv['p50_ms'])} | {ms(lv['p99_ms'])} | "
                     f"{lv['throughput_rps']} | {share} | {lv['mean_tokens']} |")
    note = "" if raw["c16"]["vllm"] else f" (vLLM's server not measured: no {args.vllm})"
    doc.append(f"**c=16**, {args.requests} held-out prompts, the trained run (target: grpo serve's throughput >= "
               f"vLLM's OpenAI server's; `vllm serve` on the run exported){note}; load {raw['c16']['load']}:\n\n"
               + "\n".join(lines) + "\n")
    took = time.monotonic() - t0
    doc.append(f"\nRun time: the measurement {took / 60:.1f} min" + (f", the training first {trained_s / 60:.1f} min"
                                                                    if trained_s > 1 else "") + ".\n")
    write()
    print("".join(doc))
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
