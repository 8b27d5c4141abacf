"""The group size G: variance of the policy gradient over resampled groups, and reward after a fixed
budget, at G = 2, 4, 8, 16 on the embedded default model (seed 000: the group-relative gradient's
variance falls as 1/G; seed 003 section 2.2 sweeps K = 2, 4, 8, 16 and settles on 4).

1. Gradient variance. For ``--prompts`` fixed arithmetic prompts (those of the first ``--probe`` with
   accuracy nearest 1/2 over 8 samples), ``--resamples`` times: sample G
   completions of each (temperature 1), score them (numeric reward), and take the gradient of
   grpo.core's loss (group z-score, ratio 1, no KL, per-sequence token mean) with respect to the
   last decoder layer's weights. Reported: tr Cov(g) = sum over weights of the unbiased variance
   across resamples, its ratio to G = 2's (the 1/G law predicts 0.5, 0.25, 0.125), G x tr Cov, and
   the share of zero-variance groups (they give no gradient, which also lowers the variance).
2. Reward after a fixed budget. From the same start, grpo's trainer runs ``--steps`` steps of
   ``--budget`` completions each (B = budget / G prompts x G), then evaluates greedy accuracy on
   ``--eval`` held-out prompts; reported with the mean training reward of the last two steps.

Everything is measured in this run, peer against peer (G against G = 2). Writes a table (stdout and
``--out``/group_size.md) and a plot (``--out``/group_size.png).

    PYTHONPATH=. python bench/group_size.py [--groups 2 4 8 16] [--resamples 6] [--steps 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch


def _prompts(a, policy, tok) -> list[dict]:
    """The ``a.prompts`` of the first ``a.probe`` arithmetic prompts whose accuracy over 8 samples is
    nearest 1/2: a prompt the model always fails (or always solves) gives zero-variance groups and no
    gradient at any G, which would measure nothing."""
    from grpo.config import Config
    from grpo.data import render_prompt
    from grpo.train.settings import task_of
    from grpo.rewards import numeric_reward
    from grpo.rollout import SamplingSettings, make_engine

    pool = task_of(Config(task="arithmetic", eval_prompts=0, seed=0,
                          arithmetic_max_operand=a.max_operand)).train[:a.probe]
    engine = make_engine("hf", policy, tok)
    ro = engine.generate([render_prompt(tok, s["prompt"]) for s in pool], group_size=8,
                         sampling=SamplingSettings(max_new_tokens=a.tokens, temperature=1.0, max_prompt_length=1024))
    engine.close()
    acc = torch.tensor([numeric_reward(t, pool[i // 8]) for i, t in enumerate(ro.texts)]).view(-1, 8).mean(1)
    order = sorted(range(len(pool)), key=lambda i: -float(acc[i] * (1 - acc[i])))
    print("probe accuracy:", [round(float(x), 3) for x in acc], flush=True)
    return [pool[i] for i in order[:a.prompts]]


def gradient_variance(a, g: int, policy, tok, samples: list[dict]) -> dict:
    """tr Cov of the last layer's gradient over ``a.resamples`` independent groups of size g."""
    from grpo import core
    from grpo.data import render_prompt
    from grpo.rewards import numeric_reward
    from grpo.rollout import SamplingSettings, make_engine

    engine = make_engine("hf", policy, tok)
    params = [p for p in policy.model.layers[-1].parameters()]
    texts = [render_prompt(tok, s["prompt"]) for s in samples]
    sampling = SamplingSettings(max_new_tokens=a.tokens, temperature=1.0, max_prompt_length=1024)
    grads, zero_share = [], []
    for _ in range(a.resamples):
        ro = engine.generate(texts, group_size=g, sampling=sampling)
        rewards = torch.tensor([numeric_reward(t, samples[i // g]) for i, t in enumerate(ro.texts)]).view(-1, g)
        ids = torch.cat([ro.prompt_ids, ro.completion_ids], 1)  # [N, P + T]
        attn = torch.cat([ro.prompt_mask, ro.completion_mask], 1)  # [N, P + T]
        pos = (attn.cumsum(1) - 1).clamp(min=0)  # [N, P + T]
        logits = policy(input_ids=ids, attention_mask=attn, position_ids=pos).logits  # [N, P + T, V]
        p = ro.prompt_ids.shape[1]
        logp = torch.log_softmax(logits[:, p - 1:-1].float(), -1).gather(-1, ro.completion_ids[..., None])[..., 0]  # [N, T]
        mask = ro.completion_mask.float()  # [N, T]
        loss, _ = core.grpo_loss(logp, logp.detach(), None, rewards, mask, kl_coef=0.0)
        gs = torch.autograd.grad(loss, params, allow_unused=True)
        grads.append(torch.cat([(x if x is not None else torch.zeros_like(w)).flatten().double()
                                for x, w in zip(gs, params)]))
        zero_share.append(float(core.zero_variance_share(rewards)))
    engine.close()
    stack = torch.stack(grads)  # [K, D]
    return {"G": g, "trace_cov": float(stack.var(dim=0, correction=1).sum()),
            "zero_variance_share": statistics.mean(zero_share)}


def reward_after_budget(a, g: int, out: Path) -> dict:
    """A fresh process trains B = budget / g prompts x g for a.steps steps and evaluates."""
    run = out / f"run-G{g}"
    cmd = ["grpo", "train", f"num_generations={g}", f"prompts_per_step={a.budget // g}",
           f"per_device_train_batch_size={a.budget}", f"max_steps={a.steps}", f"eval_prompts={a.eval}",
           f"max_completion_length={a.tokens}", f"eval_max_new_tokens={a.tokens}", "eval_pass_k=0",
           f"learning_rate={a.lr}", "rewards=numeric", f"output_dir={run}", "progress=false", "report_to=none",
           "log_completions_steps=0", f"seed={a.seed}", "beta=0.0", f"arithmetic_max_operand={a.max_operand}"]
    t0 = time.perf_counter()
    subprocess.run([*a.python, "-m", "grpo", *cmd[1:]], check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    ev = json.loads((run / "eval.json").read_text())
    return {"G": g, "reward_last2": statistics.mean(r["reward_mean"] for r in rows[-2:]),
            "accuracy_before": ev["before"]["accuracy"], "accuracy_after": ev["after"]["accuracy"],
            "seconds": time.perf_counter() - t0}


def _plot(var: list[dict], rew: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    gs = [v["G"] for v in var]
    ax1.loglog(gs, [v["trace_cov"] for v in var], "o-", label="measured tr Cov(g)")
    ax1.loglog(gs, [var[0]["trace_cov"] * gs[0] / x for x in gs], "k--", label="1/G from G = 2")
    ax1.set_xlabel("G")
    ax1.set_ylabel("gradient variance (last layer)")
    ax1.set_xticks(gs, [str(x) for x in gs])
    ax1.legend()
    ax2.plot([r["G"] for r in rew], [r["accuracy_after"] for r in rew], "o-", label="held-out accuracy after")
    ax2.plot([r["G"] for r in rew], [r["reward_last2"] for r in rew], "s--", label="training reward, last 2 steps")
    ax2.axhline(rew[0]["accuracy_before"], color="gray", linestyle=":", label="accuracy before")
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("G (same completions per step)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--prompts", type=int, default=2, help="fixed prompts of the variance measurement")
    ap.add_argument("--probe", type=int, default=12, help="prompts probed to find ones with mixed outcomes")
    ap.add_argument("--resamples", type=int, default=6, help="independent groups per G for the variance")
    ap.add_argument("--tokens", type=int, default=24, help="completion tokens")
    ap.add_argument("--budget", type=int, default=16, help="completions per training step (B x G)")
    ap.add_argument("--steps", type=int, default=4, help="training steps of the budget run")
    ap.add_argument("--eval", type=int, default=16, help="held-out prompts evaluated after")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--max-operand", type=int, default=5, help="arithmetic operands 1..this (easy: mixed outcomes)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--skip-budget", action="store_true")
    a = ap.parse_args()
    import sys

    a.python = [sys.executable]
    out = a.out or Path(tempfile.mkdtemp(prefix="group_size-"))
    out.mkdir(parents=True, exist_ok=True)
    from grpo.models.loading import DEFAULT_MODEL, load_models

    torch.manual_seed(a.seed)
    models = load_models(DEFAULT_MODEL, need_reference=False)
    policy, tok = models.policy, models.tokenizer
    samples = _prompts(a, policy, tok)
    var = []
    for g in a.groups:
        var.append(gradient_variance(a, g, policy, tok, samples))
        print(json.dumps(var[-1]), flush=True)
    rew = [] if a.skip_budget else [reward_after_budget(a, g, out) for g in a.groups]
    for r in rew:
        print(json.dumps(r), flush=True)
    base = var[0]["trace_cov"] or float("nan")  # 0 when every G = 2 group had equal rewards
    lines = [f"| G | tr Cov(g) | / G={a.groups[0]}'s | 1/G law | G x tr Cov | zero-variance share |"
             + (" reward, last 2 steps | accuracy after |" if rew else ""),
             "| --- | --- | --- | --- | --- | --- |" + (" --- | --- |" if rew else "")]
    for i, v in enumerate(var):
        row = (f"| {v['G']} | {v['trace_cov']:.3e} | {v['trace_cov'] / base:.3f} | {a.groups[0] / v['G']:.3f} | "
               f"{v['G'] * v['trace_cov']:.3e} | {v['zero_variance_share']:.2f} |")
        if rew:
            row += f" {rew[i]['reward_last2']:.3f} | {rew[i]['accuracy_after']:.3f} |"
        lines.append(row)
    if rew:
        lines.append(f"\naccuracy before training: {rew[0]['accuracy_before']:.3f}; budget {a.budget} completions x "
                     f"{a.steps} steps, lr {a.lr}, {a.eval} held-out prompts")
    text = "\n".join(lines)
    print(text)
    (out / "group_size.md").write_text(text + "\n")
    if rew:
        _plot(var, rew, out / "group_size.png")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
