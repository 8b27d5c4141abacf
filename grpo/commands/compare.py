"""`grpo compare`: GRPO against RLOO, REINFORCE and PPO with a learned critic, on equal budgets.

Each method is a `grpo train` in its own subprocess (so its peak RSS is its own), with the same
model, task, prompts, seed, steps, group size and KL coefficient; only the advantage estimator
differs (PPO: a value model and GAE, KL in the reward as in DeepSeekMath eq. 2). Writes
compare.json, compare.md and compare.png (reward curves) into the output folder.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from datetime import datetime
from pathlib import Path

from grpo.registry import Registry

# method -> the advantage_estimator it trains with (everything else is the same for every method)
METHODS: Registry[str] = Registry("method", field="--methods")
METHODS.register("grpo", "grpo", doc="GRPO: each group's rewards z-scored (DeepSeekMath eq. 3).")
METHODS.register("rloo", "rloo", doc="RLOO (Ahmadian et al. 2024): each reward against the mean of the other G - 1 of its group.")
METHODS.register("reinforce", "reinforce", doc="REINFORCE (Williams 1992): the raw reward, no baseline.")
METHODS.register("mean_baseline", "mean_baseline", doc="REINFORCE with the mean reward of the whole batch as the baseline.")
METHODS.register("dr_grpo", "dr_grpo", doc="Dr.GRPO (Liu et al. 2025): the group mean subtracted, no division by the std.")
METHODS.register("ppo", "gae", doc="PPO: a learned value model and GAE, the KL in the reward (DeepSeekMath eq. 2).")


def run_method(method: str, seed: int, out: Path, overrides: list[str]) -> dict:
    """Train one method in a subprocess; return its summary, including the child's peak RSS."""
    run_dir = out / f"{method}-seed{seed}"
    cmd = [sys.executable, "-m", "grpo", "train", *overrides, f"advantage_estimator={METHODS[method]}",
           f"seed={seed}", f"output_dir={run_dir}", "progress=false"]
    log = open(out / f"{method}-seed{seed}.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(proc.pid, 0)
    log.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{method} (seed {seed}) failed; see {out / f'{method}-seed{seed}.log'}")
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    ev = json.loads((run_dir / "eval.json").read_text())
    steps = [l["step_seconds"] for l in lines[1:]] or [lines[0]["step_seconds"]]  # first step is warm-up
    rewards = [l["reward_mean"] for l in lines]
    k = max(1, len(rewards) // 4)
    return {"method": method, "seed": seed, "steps": len(lines),
            "peak_rss_mib": usage.ru_maxrss / 1024,  # ru_maxrss is in KiB on Linux
            "training_state_mib": training_state_mib(run_dir),
            "step_seconds_median": statistics.median(steps),
            "accuracy_before": ev.get("before", {}).get("accuracy"),
            "accuracy_after": ev.get("after", {}).get("accuracy"),
            "reward_first_quarter": statistics.mean(rewards[:k]), "reward_last_quarter": statistics.mean(rewards[-k:]),
            "reward_curve": rewards,
            "critic_divergence_events": lines[-1].get("critic_divergence_events", 0)}


def _tensor_bytes(value) -> int:
    """Bytes of the tensors in a (nested) checkpoint state."""
    if hasattr(value, "element_size") and hasattr(value, "numel"):  # a tensor
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def training_state_mib(run_dir: Path) -> float | None:
    """What the run keeps for training besides the policy's weights, in MiB: the tensors of its newest
    checkpoint's trainer state other than the random streams, i.e. the optimizer's moments and, for
    PPO, the value model with its own optimizer. Unlike peak RSS it does not vary from run to run, and
    it shows the critic's cost on a model too small for RSS to notice. None without a checkpoint."""
    from grpo.infra.checkpoint import load_state, newest_checkpoint

    ckpt = newest_checkpoint(run_dir)
    if ckpt is None:
        return None
    state = load_state(ckpt)
    return sum(_tensor_bytes(v) for k, v in state.items() if k != "rng") / 2**20


def _agg(values: list[float]) -> dict:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"mean": None, "std": None}
    return {"mean": statistics.mean(vals), "std": statistics.stdev(vals) if len(vals) > 1 else 0.0}


KEYS = ("peak_rss_mib", "training_state_mib", "step_seconds_median", "accuracy_before", "accuracy_after",
        "reward_first_quarter", "reward_last_quarter", "critic_divergence_events")


def summarize(runs: list[dict], methods: list[str]) -> dict:
    """Per method: the mean of each figure over seeds (and its spread), plus ratios to GRPO."""
    table = {}
    for m in methods:
        rs = [r for r in runs if r["method"] == m]
        row = {k: _agg([r[k] for r in rs])["mean"] for k in KEYS}
        row["spread"] = {k: _agg([r[k] for r in rs])["std"] for k in KEYS}
        row["steps"] = rs[0]["steps"]
        table[m] = row
    base = table.get("grpo")
    for row in table.values():
        row["ratio_to_grpo"] = {k: (row[k] / base[k] if base and base[k] and row[k] is not None else None)
                                for k in ("peak_rss_mib", "training_state_mib", "step_seconds_median",
                                          "accuracy_after")}
    return table


def markdown(table: dict, header: str) -> str:
    rows = [header, "",
            "| method | peak RSS (MiB) | x GRPO | training state (MiB) | x GRPO | median step (s) | x GRPO "
            "| accuracy before | accuracy after | reward first/last quarter | critic divergence events |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    for m, r in table.items():
        ratio = r["ratio_to_grpo"]
        rows.append(f"| {m} | {fmt(r['peak_rss_mib'], '.0f')} | {fmt(ratio['peak_rss_mib'], '.2f')} | "
                    f"{fmt(r['training_state_mib'], '.2f')} | {fmt(ratio['training_state_mib'], '.2f')} | "
                    f"{fmt(r['step_seconds_median'], '.1f')} | {fmt(ratio['step_seconds_median'], '.2f')} | "
                    f"{fmt(r['accuracy_before'], '.1%')} | {fmt(r['accuracy_after'], '.1%')} | "
                    f"{fmt(r['reward_first_quarter'], '.2f')} / {fmt(r['reward_last_quarter'], '.2f')} | "
                    f"{fmt(r['critic_divergence_events'], '.0f') if m == 'ppo' else 'n/a'} |")
    return "\n".join(rows) + "\n"


def plot(runs: list[dict], methods: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for m in methods:
        curves = [r["reward_curve"] for r in runs if r["method"] == m]
        n = min(len(c) for c in curves)
        mean = [statistics.mean(c[i] for c in curves) for i in range(n)]
        ax.plot(range(1, n + 1), mean, label=m, marker="o", markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward of the step's rollouts")
    ax.set_title("reward curves (mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="grpo compare", description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="grpo,rloo,reinforce,ppo", help=f"comma list of {', '.join(METHODS)}")
    ap.add_argument("--steps", type=int, default=15, help="policy-gradient steps per method (the budget)")
    ap.add_argument("--repeats", type=int, default=1, help="seeds per method (0, 1, ...): mean and spread")
    ap.add_argument("--out", default=None, help="output folder (default runs/compare-<date>-<time>)")
    ap.add_argument("overrides", nargs="*", metavar="key=value", help="config keys applied to every method")
    args = ap.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        print(f"grpo compare: {METHODS.unknown(unknown[0])}", file=sys.stderr)
        return 2
    from grpo.config.io import load_config

    base = load_config(None, [*args.overrides, f"max_steps={args.steps}"])  # validate before any run
    out = Path(args.out or f"runs/compare-{datetime.now():%Y%m%d-%H%M%S}")
    out.mkdir(parents=True, exist_ok=True)
    overrides = [*args.overrides, f"max_steps={args.steps}"]
    runs = []
    for seed in range(args.repeats):
        for m in methods:
            print(f"[compare] {m} seed {seed} ...", flush=True)
            runs.append(run_method(m, seed, out, overrides))
            r = runs[-1]
            print(f"[compare] {m}: peak RSS {r['peak_rss_mib']:.0f} MiB, median step {r['step_seconds_median']:.1f} s, "
                  f"accuracy {r['accuracy_before']} -> {r['accuracy_after']}", flush=True)
    table = summarize(runs, methods)
    header = (f"Same model ({base.model}), task ({base.task}), prompts and seeds for every method: {args.steps} "
              f"policy-gradient steps x {base.prompts_per_step} prompts x {base.num_generations} completions = "
              f"{args.steps * base.sequences_per_step} rollouts per method and seed, mu = {base.num_iterations}, "
              f"beta = {base.beta}, {args.repeats} seed(s); held-out accuracy on "
              f"{'the task default number of' if base.eval_prompts is None else base.eval_prompts} prompts.")
    (out / "compare.json").write_text(json.dumps({"header": header, "methods": table, "runs": runs}, indent=2))
    (out / "compare.md").write_text(markdown(table, header))
    plot(runs, methods, out / "compare.png")
    print(markdown(table, header))
    print(f"written: {out / 'compare.md'}, {out / 'compare.json'}, {out / 'compare.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
