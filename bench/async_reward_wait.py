"""Asynchronous against synchronous GRPO where the reward waits: steps per hour and held-out accuracy.

A real HTTP reward server on loopback, keyed as grpo's URL rewards expect (``Authorization: Bearer``
from ``$GRPO_REWARD_API_KEY``; grpo's guarded server layer: key, body and JSON limits, 4xx on a bad
request), answers each batch after ``--wait`` seconds (5 s: a judge model scoring 32 completions)
with the built-in numeric reward of each completion. Each run is ``grpo train`` in a process of its
own on the default 4 x 8 step of the embedded model (SmolLM2-135M-Instruct, arithmetic), the reward
given as the server's URL: synchronous, and ``async_rollouts=true max_staleness=K``. Steps per hour
count the training loop only (the sum of the metrics lines' step_seconds: sampling, rewards, update,
sync and, asynchronous, the wait for the queue and the engine process's start in step 1); the
held-out accuracy is the run's greedy evaluation after training.

``--task calculator`` or ``--task code_hard`` (with ``--own-rewards``) times those tasks with their own
rewards (the calculator's numeric reward over tool episodes; the sandboxed tests of code_hard).

    PYTHONPATH=. python bench/async_reward_wait.py [--seeds 0 1 2] [--steps 25] [--wait 5] [--staleness 1]
        [--task arithmetic] [--own-rewards] [--eval-prompts 200] [--set key=value ...] [--out results.json]

Prints one row per run, the ratio of mean steps per hour and the bytes each step's weights move to
the engine process against a copy of every weight (``--set use_peft=true``: the adapters only), with
the CPU, the load average and the commit (figures from a shared machine are contended; the ratio
comes from the same session).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from machine import commit, cpu_line  # bench/machine.py

ROOT = Path(__file__).resolve().parents[1]


def reward_server(wait: float, key: str):
    """A keyed server on 127.0.0.1 (a free port) whose POST /score answers after ``wait`` seconds."""
    from grpo.infra.http import GuardedServer, HttpError, HttpLimits, Route, parse_json
    from grpo.rewards.builtin import numeric_reward

    limits = HttpLimits(max_body_bytes=8 << 20)

    def score(raw: bytes, _kind: str) -> dict:
        body = parse_json(raw, max_depth=limits.max_json_depth)
        comps, samples = body.get("completions"), body.get("samples")
        if not isinstance(comps, list) or not isinstance(samples, list) or len(comps) != len(samples):
            raise HttpError(400, "completions", "completions and samples: two lists of the same length")
        time.sleep(wait)
        return {"scores": [numeric_reward(str(c), s if isinstance(s, dict) else {}) for c, s in zip(comps, samples)]}

    server = GuardedServer(("127.0.0.1", 0), {("POST", "/score"): Route(score)}, api_key=key, limits=limits)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def run(args, seed: int, mode: str, url: str | None, out: Path) -> dict:
    """One ``grpo train`` run; its steps per hour, evaluation and (async) staleness figures."""
    run_dir = out / f"{args.task}-{mode}-seed{seed}"
    settings = [f"task={args.task}", f"output_dir={run_dir}", f"max_steps={args.steps}", f"seed={seed}",
                "progress=false", "report_to=none", f"eval_prompts={args.eval_prompts}", "eval_pass_k=0",
                "log_completions_steps=0"]
    if url is not None:
        settings += [f"rewards={url}", f"reward_timeout={args.wait + 60}"]
    if mode != "sync":
        settings += ["async_rollouts=true", f"max_staleness={args.staleness}"]
    settings += args.set
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "grpo.cli", "train", *settings], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{mode} seed {seed} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    seconds = [x["step_seconds"] for x in lines]
    result = json.loads((run_dir / "eval.json").read_text()) if (run_dir / "eval.json").is_file() else {}
    row = {"task": args.task, "mode": mode, "seed": seed, "steps": len(lines), "loop_seconds": sum(seconds),
           "steps_per_hour": 3600 * len(lines) / sum(seconds),
           "steps_per_hour_after_step_1": 3600 * (len(lines) - 1) / max(sum(seconds[1:]), 1e-9),
           "wall_seconds": wall, "accuracy_before": result.get("before", {}).get("accuracy"),
           "accuracy_after": result.get("after", {}).get("accuracy"),
           "train_reward_last5": sum(x.get("reward_mean", 0.0) for x in lines[-5:]) / min(5, len(lines)),
           "load_average": os.getloadavg()[0]}
    if mode != "sync":
        row.update(staleness_mean=sum(x["async/staleness_mean"] for x in lines) / len(lines),
                   dropped_groups=sum(x["async/dropped_groups"] for x in lines),
                   mismatch_kl_k3_mean=sum(x.get("async/mismatch_kl_k3", 0.0) for x in lines) / len(lines),
                   publish_bytes=max(x["async/publish_bytes"] for x in lines),
                   full_publish_bytes=lines[0]["async/full_publish_bytes"])
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--wait", type=float, default=5.0, help="seconds the reward server takes per batch")
    ap.add_argument("--staleness", type=int, default=1, help="max_staleness of the asynchronous runs")
    ap.add_argument("--task", default="arithmetic")
    ap.add_argument("--own-rewards", action="store_true", help="the task's own rewards, no reward server")
    ap.add_argument("--eval-prompts", type=int, default=200)
    ap.add_argument("--modes", nargs="+", default=["sync", "async"])
    ap.add_argument("--out", default="", help="a JSON file for the rows")
    ap.add_argument("--set", nargs="*", default=[], help="more key=value settings for every run")
    args = ap.parse_args()
    url = None
    server = None
    if not args.own_rewards:
        key = secrets.token_hex(16)
        os.environ["GRPO_REWARD_API_KEY"] = key  # what grpo's URL rewards send
        server = reward_server(args.wait, key)
        url = f"http://127.0.0.1:{server.server_address[1]}/score"
    print(f"# {cpu_line()}; commit {commit()}; {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="async-bench-") as tmp:
        for seed in args.seeds:  # the modes alternate, so a change in the machine's load hits both
            for mode in args.modes:
                row = run(args, seed, mode, url, Path(tmp))
                rows.append(row)
                print(json.dumps(row), flush=True)
    if server is not None:
        server.shutdown()
    by_mode = {m: [r for r in rows if r["mode"] == m] for m in args.modes}
    print("\n| mode | runs | steps/hour | after step 1 | accuracy after (each seed) |\n|---|---|---|---|---|")
    for m, rs in by_mode.items():
        sph = sum(r["steps_per_hour"] for r in rs) / len(rs)
        sph1 = sum(r["steps_per_hour_after_step_1"] for r in rs) / len(rs)
        accs = ", ".join(f"{r['accuracy_after']:.3f}" if r["accuracy_after"] is not None else "-" for r in rs)
        print(f"| {m} | {len(rs)} | {sph:.0f} | {sph1:.0f} | {accs} |")
    if "sync" in by_mode and "async" in by_mode:
        ratio = (sum(r["steps_per_hour"] for r in by_mode["async"]) / len(by_mode["async"])) / \
                (sum(r["steps_per_hour"] for r in by_mode["sync"]) / len(by_mode["sync"]))
        print(f"\nasync / sync steps per hour: {ratio:.2f}")
        moved = max(r["publish_bytes"] for r in by_mode["async"])
        full = by_mode["async"][0]["full_publish_bytes"]
        print(f"weights moved to the engine process per step: {moved} bytes, {moved / full:.2%} of all weights "
              f"({full} bytes)")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
