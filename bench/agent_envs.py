"""The embedded SmolLM2-135M-Instruct trained 3 steps on a verifiers environment and on an OpenEnv server,
each with its own rewards: the suite's test environments (tests/vf_envs/grpo_vf_guess.py, a multi-turn
guessing game scored by its rubric; tests/openenv_server.py, guess a number served by OpenEnv's own app),
run as a user runs them: ``grpo train`` subprocesses, the OpenEnv server a process on loopback.

    PYTHONPATH=. python bench/agent_envs.py [--out /tmp/agent_envs] [--steps 3]

Prints each run's per-step reward, the agent or tool metrics, and the held-out evaluation before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = [sys.executable, "-m", "grpo.cli"]


def _train(out: Path, env: dict, *args: str) -> dict:
    log = out.with_suffix(".log")
    with log.open("w") as f:
        subprocess.run([*PY, "train", f"output_dir={out}", *args], check=True, stdout=f, stderr=subprocess.STDOUT,
                       env=env, cwd=ROOT)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    keys = ("reward_mean", "reward_failures", "agent/calls_per_episode", "tools/call_rate", "tools/calls_per_episode",
            "step_seconds")
    result = json.loads((out / "eval.json").read_text())
    return {"steps": [{k: line[k] for k in ("step", *keys) if k in line} for line in lines],
            "eval": {w: {k: result[w][k] for k in ("accuracy", "mean_length", "tools") if k in result[w]}
                     for w in ("before", "after")}}


def _server(port: int, env: dict) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "tests.openenv_server:app", "--host", "127.0.0.1",
                             "--port", str(port), "--log-level", "warning"], cwd=ROOT, env=env)
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the OpenEnv server did not start")
            time.sleep(0.2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/agent_envs")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests' / 'vf_envs'}"}
    report = {"verifiers": _train(out / "verifiers", env, "task=verifiers:grpo-vf-guess", f"max_steps={args.steps}",
                                  "max_completion_length=48", "eval_prompts=4", "rollout_engine=fast")}
    rows = out / "play.jsonl"
    rows.write_text("".join(json.dumps({"prompt": "Play the guessing game.", "answer": "", "seed": s}) + "\n"
                            for s in range(40)))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = _server(port, env)
    try:
        report["openenv"] = _train(out / "openenv", env, f"task={rows}", f"environment_factory=openenv:http://127.0.0.1:{port}",
                                   "rewards=environment", f"max_steps={args.steps}", "max_turns=2",
                                   "tool_example_call=step(guess=50)",
                                   "tool_example_question=Guess my number between 1 and 100.",
                                   "max_completion_length=64", "eval_prompts=8", "eval_pass_k=0", "rollout_engine=fast")
    finally:
        server.terminate()
        server.wait(timeout=20)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
