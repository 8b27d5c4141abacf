"""Process supervision with a learned process reward model against the rule and against outcome supervision,
on the embedded model and the arithmetic task (whose steps the rule `arithmetic_steps` can also judge).

1. `grpo prm label`: Math-Shepherd's automatic step labels from the embedded model's own solutions to
   --label-prompts training prompts (4 solutions each, 4 continuations from each step's end), and a held-out
   labelled set from the task's held-out prompts (another seed).
2. `grpo prm train`: a PRM from the embedded model on the training labels.
3. The PRM's held-out step accuracy against the continuation labels and against the rule's labels of the
   same steps (a step the rule judges: a line with an equation, or the final one), with the share of
   steps labelled good (what always answering "good" scores).
4. Training runs: supervision=outcome (the task's rewards), supervision=process with the rule, with the
   PRM, and with the PRM retrained during the run (relabelled by the policy every 5 steps, which also resets
   the KL reference there), --steps steps, --seeds seeds each; greedy held-out accuracy before and after, and the defect
   densities of `grpo audit` on 50 held-out problems for each trained model (and the base once).

Prints markdown tables with the CPU and the commit; every number goes to --out.

    python bench/prm.py --steps 25 --seeds 1 2 3 --eval 100 --out bench-prm.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import commit, cpu_line  # noqa: E402

MODEL = "embedded:SmolLM2-135M-Instruct"
ARMS = {"outcome": [], "rule": ["supervision=process", "step_reward=arithmetic_steps"],
        "prm": ["supervision=process", "step_reward=prm:{prm}"],
        # the same PRM relabelled by the policy and retrained with 10% replay every 5 steps (Algorithm 1)
        "prm_retrained": ["supervision=process", "step_reward=prm:{prm}", "ref_reset_steps=5",
                          "reward_model_train_steps=8", "reward_model_batch_size=8", "prm_label_solutions=16"]}


def grpo(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "grpo", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"grpo {' '.join(args[:3])} failed:\n{proc.stderr[-3000:]}")


def build_prm(root: Path, prompts: int) -> dict:
    """Label the training and held-out solutions, train the PRM; the paths and `grpo prm train`'s report."""
    train, held, prm = root / "labels-train.jsonl", root / "labels-heldout.jsonl", root / "prm"
    if not train.is_file():
        grpo("prm", "label", "--model", MODEL, "--out", str(train), "--prompts", str(prompts), "--seed", "0")
    if not held.is_file():
        grpo("prm", "label", "--model", MODEL, "--out", str(held), "--split", "eval", "--prompts", "25", "--seed", "1")
    if not (prm / "prm_train.json").is_file():
        grpo("prm", "train", "--data", str(train), "--model", MODEL, "--out", str(prm), "--heldout", "0.1")
    return {"train": train, "heldout": held, "prm": prm, "report": json.loads((prm / "prm_train.json").read_text())}


def auc(pos: list[float], neg: list[float]) -> float | None:
    """The chance a good step scores above a bad one (ties count half): what a group-normalised step reward
    uses of the scores, whatever their calibration."""
    if not pos or not neg:
        return None
    return sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))


def heldout_accuracy(prm: Path, heldout: Path) -> dict:
    """The PRM's step predictions (p(good) > 0.5) against the continuation labels (soft >= 0.5) and against
    the rule on the steps it judges (the rule's step ending where the PRM's step ends), with the AUC of
    its scores against each and the share of steps labelled good (what always answering "good" scores)."""
    from grpo.rewards.prm import PRMScorer, split_steps
    from grpo.rewards.steps import arithmetic_steps

    scorer = PRMScorer(str(prm))
    ms, rule = {True: [], False: []}, {True: [], False: []}  # label -> the PRM's scores of those steps
    for line in heldout.read_text().splitlines():
        row = json.loads(line)
        steps = split_steps(row["solution"], scorer.spec.separator)
        scores = scorer.scores(row["prompt"], [t for t, _ in steps])
        for p, y in zip(scores, row["soft"]):
            ms[y >= 0.5].append(p)
        judged = {end: v for v, end in arithmetic_steps(row["solution"], {"prompt": row["prompt"], "answer": row["answer"]})}
        for p, (_, end) in zip(scores, steps):
            if end in judged:
                rule[judged[end] >= 1.0].append(p)

    def agree(by_label: dict) -> float | None:
        n = len(by_label[True]) + len(by_label[False])
        return (sum(p > 0.5 for p in by_label[True]) + sum(p <= 0.5 for p in by_label[False])) / n if n else None

    return {"steps": len(ms[True]) + len(ms[False]), "vs_continuations": agree(ms),
            "auc_continuations": auc(ms[True], ms[False]),
            "good_share_continuations": len(ms[True]) / max(1, len(ms[True]) + len(ms[False])),
            "rule_steps": len(rule[True]) + len(rule[False]), "vs_rule": agree(rule), "auc_rule": auc(rule[True], rule[False]),
            "good_share_rule": len(rule[True]) / max(1, len(rule[True]) + len(rule[False]))}


def base_prm(root: Path) -> Path:
    """The untrained embedded model read as a PRM (its files linked, the default prm.json): the before."""
    from grpo.models.loading import resolve_model_path
    from grpo.rewards.prm import PRMSpec

    out = root / "base-prm"
    if not out.is_dir():
        out.mkdir()
        for f in Path(resolve_model_path(MODEL)).iterdir():
            (out / f.name).symlink_to(f.resolve())
        PRMSpec().write(out)
    return out


def train_run(arm: str, seed: int, steps: int, eval_prompts: int, root: Path, prm: Path) -> dict:
    out = root / f"{arm}-seed{seed}"
    if not (out / "eval.json").is_file() or "after" not in json.loads((out / "eval.json").read_text()):
        grpo("train", f"seed={seed}", f"max_steps={steps}", f"eval_prompts={eval_prompts}", "eval_pass_prompts=0",
             f"output_dir={out}", "progress=false", "report_to=none", *[a.format(prm=prm) for a in ARMS[arm]])
    if not (out / "audit.json").is_file():
        grpo("audit", str(out), "--no-base")
    ev = json.loads((out / "eval.json").read_text())
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    audit = json.loads((out / "audit.json").read_text())["models"]
    model = next(iter(audit.values()))
    return {"arm": arm, "seed": seed, "before": ev["before"]["accuracy"], "after": ev["after"]["accuracy"],
            "steps_per_completion": statistics.mean(m.get("steps_per_completion", 1.0) for m in metrics),
            "audit_accuracy": model["accuracy"], "per_100_tokens": model["per_100_tokens"]}


def base_audit(root: Path) -> dict:
    out = root / "base-audit"
    if not (out / "audit.json").is_file():
        grpo("audit", "--model", MODEL, "--out", str(out))
    return next(iter(json.loads((out / "audit.json").read_text())["models"].values()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--eval", type=int, default=100)
    ap.add_argument("--label-prompts", type=int, default=64)
    ap.add_argument("--root", type=Path, default=Path("runs/bench-prm"))
    ap.add_argument("--out", type=Path, default=Path("bench-prm.json"))
    ap.add_argument("--arms", nargs="+", default=list(ARMS))
    args = ap.parse_args()
    print(f"cpu: {cpu_line()}; commit {commit()}; load average {os.getloadavg()[0]:.2f} at the start", flush=True)
    args.root.mkdir(parents=True, exist_ok=True)
    built = build_prm(args.root, args.label_prompts)
    acc = {"base": heldout_accuracy(base_prm(args.root), built["heldout"]),
           "trained": heldout_accuracy(built["prm"], built["heldout"])}
    print(f"PRM: {json.dumps(built['report'])}\nheld-out steps: {json.dumps(acc)}", flush=True)
    rows = [train_run(arm, seed, args.steps, args.eval, args.root, built["prm"].resolve())
            for seed in args.seeds for arm in args.arms]
    base = base_audit(args.root)
    kinds = list(base["per_100_tokens"])
    print("\n| supervision | after, by seed | after, mean | steps per completion | audit accuracy | "
          + " | ".join(kinds) + " |")
    print("| --- " * (5 + len(kinds)) + "|")
    print(f"| base model | before: {rows[0]['before']:.0%} | | | {base['accuracy']:.0%} | "
          + " | ".join(f"{base['per_100_tokens'][k]:.2f}" for k in kinds) + " |")
    for arm in args.arms:
        mine = [r for r in rows if r["arm"] == arm]
        after = " / ".join(f"{r['after']:.0%}" for r in mine)
        print(f"| {arm} | {after} | "
              f"{statistics.mean(r['after'] for r in mine):.1%} | "
              f"{statistics.mean(r['steps_per_completion'] for r in mine):.2f} | "
              f"{statistics.mean(r['audit_accuracy'] for r in mine):.0%} | "
              + " | ".join(f"{statistics.mean(r['per_100_tokens'][k] for r in mine):.2f}" for k in kinds) + " |")
    args.out.write_text(json.dumps({"cpu": cpu_line(), "commit": commit(), "prm_train": built["report"],
                                    "heldout_step_accuracy": acc, "base_audit": base, "runs": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
