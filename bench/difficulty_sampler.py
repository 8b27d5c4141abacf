"""The difficulty sampler against the epoch-shuffled (uniform) one on arithmetic of mixed difficulty,
on the embedded default model: held-out greedy accuracy at the same steps, for several seeds.

The task: 48 problems, a third easy sums (1..9 + 1..9), a third products of 3..15, a third products
of a 3-digit by a 2-digit number; 16 of them held out (a seeded split of the file, the same for every
run). Each run trains ``--steps`` steps of B = 4 prompts x G = 8 with grpo's defaults otherwise and
evaluates the held-out problems every ``--eval-steps`` steps; a run with ``difficulty_sampling=true``
and one without share each seed. Writes ``--out``/difficulty.json and prints a table: per run, the
held-out accuracy at step 0, each evaluation step and the end, and the mean share of zero-variance
groups (the ones the sampler is there to avoid).

    PYTHONPATH=. python bench/difficulty_sampler.py [--seeds 1 2 3] [--steps 10] [--eval-steps 5]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from grpo.config import Config
from grpo.train.trainer import Trainer


def mixed_rows(seed: int = 11) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(16):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        rows.append({"prompt": f"What is {a} + {b}?", "answer": str(a + b), "level": "easy"})
        a, b = rng.randint(3, 15), rng.randint(3, 15)
        rows.append({"prompt": f"What is {a} * {b}?", "answer": str(a * b), "level": "medium"})
        a, b = rng.randint(100, 999), rng.randint(11, 99)
        rows.append({"prompt": f"What is {a} * {b}?", "answer": str(a * b), "level": "hard"})
    return rows


def run(out: Path, data: Path, *, seed: int, difficulty: bool, steps: int, eval_steps: int) -> dict:
    name = f"{'difficulty' if difficulty else 'uniform'}-s{seed}"
    cfg = Config(task=str(data), eval_prompts=16, max_steps=steps, eval_steps=eval_steps, prompts_per_step=4,
                 num_generations=8, seed=seed, difficulty_sampling=difficulty, output_dir=str(out / name),
                 progress=False, report_to="none", eval_pass_k=0, eval_max_new_tokens=24)
    start = time.time()
    result = Trainer(cfg).train()
    lines = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]
    accuracy = {0: result["before"]["accuracy"], **{x["step"]: x["eval/accuracy"] for x in lines if "eval/accuracy" in x}}
    zero = [x["zero_variance_share"] for x in lines if "zero_variance_share" in x]
    return {"name": name, "heldout_accuracy": accuracy, "zero_variance_share": sum(zero) / max(len(zero), 1),
            "seconds": time.time() - start}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--eval-steps", type=int, default=5)
    ap.add_argument("--out", default="runs/difficulty-bench")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = out / "mixed.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in mixed_rows()))
    results = []
    for seed in args.seeds:
        for difficulty in (False, True):
            results.append(run(out, data, seed=seed, difficulty=difficulty, steps=args.steps,
                               eval_steps=args.eval_steps))
            (out / "difficulty.json").write_text(json.dumps(results, indent=1))
            r = results[-1]
            print(r["name"], " ".join(f"step {k}: {v:.3f}" for k, v in r["heldout_accuracy"].items()),
                  f"zero-variance share {r['zero_variance_share']:.2f}", f"{r['seconds']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
