"""`grpo data filter`: keep a task's problems with at least three logical steps, then (with --models)
sample answers from several models, score them with a judge, and mark the anchor answers by pairwise
win rate; writes a JSONL that `grpo train task=FILE` reads (docs/guides/audit.md)."""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

from grpo.data.filter import connective_filter, select_anchors
from grpo.errors import ConfigError


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="grpo data filter", description=(
        "Keep problems whose worked solution (else prompt) has at least --min-steps logical steps; with --models, "
        "mark answers winning > --high / < --low of their pairwise comparisons under --judge as anchors."))
    ap.add_argument("--task", default="gsm8k", help="a built-in task or a .jsonl/.json/.parquet file (default gsm8k)")
    ap.add_argument("--out", required=True, help="the JSONL to write")
    ap.add_argument("--min-steps", type=int, default=3, help="least logical steps a problem keeps (default 3)")
    ap.add_argument("--max-problems", type=int, default=0, help="the first this many kept problems only (0: all)")
    ap.add_argument("--models", default="", help="comma-separated models to answer (any `grpo train` accepts)")
    ap.add_argument("--samples", type=int, default=5, help="answers per model and problem (default 5)")
    ap.add_argument("--judge", default="", help="reward that scores each answer (default: the task's reward; "
                    "reward_model with reward_model=PATH for a reward model)")
    ap.add_argument("--high", type=float, default=0.8, help="win rate above which an answer is a high anchor")
    ap.add_argument("--low", type=float, default=0.2, help="win rate below which an answer is a low anchor")
    ap.add_argument("--max-new-tokens", type=int, default=256, help="token limit of each answer (default 256)")
    ap.add_argument("--temperature", type=float, default=0.7, help="sampling temperature of the answers (default 0.7)")
    ap.add_argument("overrides", nargs="*", metavar="key=value", help="config keys (rewards, reward_model, ...)")
    return ap


def _candidates(models: list[str], rows: list[dict], *, sampling, samples: int, dtype: str,
                system_prompt: str, template_kwargs: dict | None = None) -> list[list[dict]]:
    """Per row, every model's ``samples`` answers drawn with ``sampling`` (a rollout SamplingSettings):
    [{"model", "completion"}]."""
    from grpo.data import render_prompt
    from grpo.models import load_models
    from grpo.rollout import make_engine

    out: list[list[dict]] = [[] for _ in rows]
    for name in models:
        models_ = load_models(name, dtype=dtype, need_reference=False, chat_template_kwargs=template_kwargs)
        engine = make_engine("hf", models_.policy, models_.tokenizer)
        try:
            for lo in range(0, len(rows), 8):
                chunk = rows[lo:lo + 8]
                prompts = [render_prompt(engine.tokenizer, r["prompt"], system_prompt) for r in chunk]
                ro = engine.generate(prompts, group_size=samples, sampling=sampling)
                for j, text in enumerate(ro.texts):
                    out[lo + j // samples].append({"model": name, "completion": text})
        finally:
            engine.close()
    return out


def _score(cands: list[list[dict]], rows: list[dict], judge) -> None:
    from grpo.rewards import score_completions

    texts = [c["completion"] for cs in cands for c in cs]
    samples = [r for r, cs in zip(rows, cands) for _ in cs]
    values = score_completions(texts, samples, {"judge": judge}).per_reward["judge"].tolist()
    flat = [c for cs in cands for c in cs]
    for c, v in zip(flat, values):
        c["score"] = None if math.isnan(v) else v  # None: the judge could not score it (it loses every comparison)


USAGE = ("usage: grpo data filter --task T --out FILE.jsonl [options] [key=value ...]\n\n"
         "  filter  keep problems with >= --min-steps logical steps; with --models, mark anchor answers by win rate")


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if argv[0] != "filter":
        raise ConfigError(f"unknown command {argv[0]!r}; the command is "
                          "`grpo data filter --task T --out FILE.jsonl [...]`")
    args = _parser().parse_args(argv[1:])
    from grpo.config.io import load_config
    from grpo.train.settings import task_of
    from grpo.infra.runtime import import_from
    from grpo.rewards import resolve_reward
    from grpo.rollout import SamplingSettings
    from grpo.train.settings import reward_options

    cfg = load_config(None, list(args.overrides) + [f"task={args.task}"])
    import_from(cfg.working_dir, os.getcwd())
    task = task_of(cfg)
    rows, stats = connective_filter(task.train + task.eval, min_steps=args.min_steps)
    if args.max_problems:
        rows = rows[:args.max_problems]
    print(f"connective filter: {stats['kept']} of {stats['rows']} problems have >= {args.min_steps} logical steps "
          f"({stats['kept_share']:.1%})", flush=True)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if models:
        judge_name = args.judge or cfg.reward_names[0]
        judge = resolve_reward(judge_name, reward_options(cfg))
        sampling = SamplingSettings(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                    max_prompt_length=cfg.max_prompt_length)
        cands = _candidates(models, rows, sampling=sampling, samples=args.samples, dtype=cfg.dtype,
                            template_kwargs=cfg.chat_template_kwargs,
                            system_prompt=cfg.system_prompt)
        _score(cands, rows, judge)
        rows = [{**r, **select_anchors(cs, high=args.high, low=args.low)} for r, cs in zip(rows, cands)]
        highs, lows = sum(len(r["anchor_high"]) for r in rows), sum(len(r["anchor_low"]) for r in rows)
        print(f"anchors by {judge_name}: {highs} high (win rate > {args.high}), {lows} low (< {args.low}) among "
              f"{sum(len(cs) for cs in cands)} answers from {len(models)} models", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"written: {out} ({len(rows)} rows; train on it with `grpo train task={out}`)")
    return 0
