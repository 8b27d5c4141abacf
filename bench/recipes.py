"""The published recipes (recipe=NAME) against grpo's default, on the embedded default task.

Each recipe and the default train the embedded SmolLM2-135M-Instruct for --steps steps (the default run's
4 prompts x 8 completions), with --seeds seeds each; every run's held-out greedy accuracy before and after
(the same --eval held-out sums for all runs of a seed) and its training time. Prints a markdown table with
the CPU and the commit, and writes every run's numbers to --out.

    python bench/recipes.py --steps 25 --seeds 1 2 3 --eval 100 --out bench-recipes.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import commit, cpu_line  # noqa: E402

RECIPES = ("none", "deepseekmath_grpo", "dapo", "dr_grpo", "gspo")


def run(recipe: str, seed: int, steps: int, eval_prompts: int, root: Path) -> dict:
    out = root / f"{recipe}-seed{seed}"
    if not (out / "eval.json").is_file() or "after" not in json.loads((out / "eval.json").read_text()):
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "grpo", "train", f"recipe={recipe}", f"seed={seed}",
                               f"max_steps={steps}", f"eval_prompts={eval_prompts}", "eval_pass_prompts=0",
                               f"output_dir={out}", "progress=false", "report_to=none"],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{recipe} seed {seed} failed:\n{proc.stderr[-3000:]}")
        (out / "bench_seconds.txt").write_text(f"{time.monotonic() - t0:.1f}\n")
    ev = json.loads((out / "eval.json").read_text())
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"recipe": recipe, "seed": seed, "before": ev["before"]["accuracy"], "after": ev["after"]["accuracy"],
            "seconds": float((out / "bench_seconds.txt").read_text()),
            "reward_last5": statistics.mean(m["reward_mean"] for m in metrics[-5:]),
            "clip_fraction_mean": statistics.mean(m.get("clip_fraction", 0.0) or 0.0 for m in metrics)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--eval", type=int, default=100)
    ap.add_argument("--root", type=Path, default=Path("runs/bench-recipes"))
    ap.add_argument("--out", type=Path, default=Path("bench-recipes.json"))
    ap.add_argument("--recipes", nargs="+", default=list(RECIPES))
    args = ap.parse_args()
    print(f"cpu: {cpu_line()}; commit {commit()}; load average {os.getloadavg()[0]:.2f} at the start")
    rows = []
    for seed in args.seeds:
        for recipe in args.recipes:
            rows.append(run(recipe, seed, args.steps, args.eval, args.root))
            print(json.dumps(rows[-1]), flush=True)
    args.out.write_text(json.dumps({"cpu": cpu_line(), "commit": commit(), "steps": args.steps, "eval": args.eval,
                                    "runs": rows}, indent=1) + "\n")
    print("\n| recipe | held-out accuracy before | after, per seed | after, mean | reward (last 5 steps) | "
          "clip fraction | seconds a run |\n|---|---|---|---|---|---|---|")
    for recipe in args.recipes:
        mine = [r for r in rows if r["recipe"] == recipe]
        after = [r["after"] for r in mine]
        print(f"| {recipe} | {mine[0]['before']:.1%} | {' / '.join(f'{a:.0%}' for a in after)} | "
              f"**{statistics.mean(after):.1%}** | {statistics.mean(r['reward_last5'] for r in mine):.3f} | "
              f"{statistics.mean(r['clip_fraction_mean'] for r in mine):.3f} | "
              f"{statistics.mean(r['seconds'] for r in mine):.0f} |")


if __name__ == "__main__":
    main()
