"""`grpo prm label` and `grpo prm train`: a process reward model from the policy's own samples (Math-Shepherd's
automatic step labels, train/prm_labels.py) and its training (commands/prm_train.py); the folder it
writes is what ``step_reward=prm:FOLDER`` scores with (docs/guides/rewards.md: Process supervision)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

USAGE = ("usage: grpo prm {label,train} ...\n\n"
         "  label  sample solutions from a model, label each step by the share of continuations from it that reach\n"
         "         the verified answer (JSONL)\n"
         "  train  train a process reward model on labelled steps (a model folder with prm.json)")


def _label(argv: list[str]) -> int:
    from grpo.train.prm_labels import LabelSettings, label_steps, write_labels
    from grpo.config.io import load_config
    from grpo.data import render_prompt
    from grpo.errors import ConfigError
    from grpo.infra.runtime import import_from
    from grpo.models import load_models
    from grpo.rewards import resolve_reward
    from grpo.rollout import make_engine
    from grpo.train.settings import reward_options, sampling_settings, task_of

    ap = argparse.ArgumentParser(prog="grpo prm label", description="Math-Shepherd's automatic step labels from a "
                                 "model's own solutions to a task's prompts.")
    ap.add_argument("--model", required=True, help="the policy: a hub id, model folder or run folder")
    ap.add_argument("--task", default="arithmetic", help="the task whose training prompts are solved (default arithmetic)")
    ap.add_argument("--out", required=True, type=Path, help="the JSONL to write")
    ap.add_argument("--prompts", type=int, default=32, help="prompts solved, the split's first (default 32)")
    ap.add_argument("--split", choices=("train", "eval"), default="train",
                    help="the task's training prompts, or its held-out ones for a held-out labelled set (default train)")
    ap.add_argument("--solutions", type=int, default=4, help="solutions sampled per prompt (default 4)")
    ap.add_argument("--continuations", type=int, default=4, help="completions sampled from each step's end (default 4)")
    ap.add_argument("--separator", default="\n", help="what ends a step (default a newline)")
    ap.add_argument("--seed", type=int, default=0, help="the keys of every draw (default 0)")
    ap.add_argument("overrides", nargs="*", metavar="key=value",
                    help="config keys (rewards: the verifier is the first; max_completion_length, temperature, ...)")
    args = ap.parse_args(argv)
    cfg = load_config(None, [f"model={args.model}", f"task={args.task}", *args.overrides])
    import_from(cfg.working_dir, os.getcwd())
    verifier = resolve_reward(cfg.reward_names[0], reward_options(cfg))
    samples = list(getattr(task_of(cfg), args.split)[:args.prompts])
    if not samples:
        raise ConfigError(f"--split {args.split}: the task {cfg.task!r} has no {args.split} prompts")
    models = load_models(cfg.model, dtype=cfg.dtype, need_reference=False, chat_template_kwargs=cfg.chat_template_kwargs)
    engine = make_engine("hf", models.policy, models.tokenizer)
    try:
        prompts = [render_prompt(models.tokenizer, r["prompt"], cfg.system_prompt) for r in samples]
        rows = label_steps(engine, samples, prompts, verifier, sampling_settings(cfg),
                           LabelSettings(args.solutions, args.continuations, args.separator, args.seed))
    finally:
        engine.close()
    write_labels(rows, args.out)
    steps = [v for r in rows for v in r["soft"]]
    print(json.dumps({"out": str(args.out), "solutions": len(rows), "steps": len(steps),
                      "solutions_correct": sum(r["correct"] for r in rows),
                      "mean_soft_label": sum(steps) / len(steps) if steps else None}, indent=2))
    return 0


def _train(argv: list[str]) -> int:
    from transformers import AutoModelForCausalLM

    from grpo.commands.prm_train import PRMTrainSettings, read_labels, train_prm
    from grpo.errors import ConfigError
    from grpo.models.loading import load_tokenizer, resolve_model_path
    from grpo.rewards.prm import PRMSpec

    d = PRMSpec()
    ap = argparse.ArgumentParser(prog="grpo prm train", description="Train a process reward model on labelled steps.")
    ap.add_argument("--data", required=True, type=Path, help="`grpo prm label`'s JSONL")
    ap.add_argument("--model", required=True, help="the model to start from (a hub id, folder, or the embedded default)")
    ap.add_argument("--out", required=True, type=Path, help="the folder to write (must not exist or be empty)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--batch", type=int, default=4, help="solutions per optimizer step (default 4)")
    ap.add_argument("--label", default="soft", choices=("soft", "hard"), help="the share (soft) or any (hard)")
    ap.add_argument("--heldout", type=float, default=0.1, help="share of solutions kept for the step accuracy")
    ap.add_argument("--seed", type=int, default=0)
    for name in ("step_tag", "good", "bad", "separator"):
        ap.add_argument(f"--{name.replace('_', '-')}", default=getattr(d, name), help=f"default {getattr(d, name)!r}")
    args = ap.parse_args(argv)
    if args.out.exists() and any(args.out.iterdir()):
        raise ConfigError(f"--out {args.out}: exists and is not empty")
    spec = PRMSpec(args.step_tag, args.good, args.bad, args.separator)
    path = resolve_model_path(args.model)
    model = AutoModelForCausalLM.from_pretrained(path, dtype="float32")
    tok = load_tokenizer(path)
    result = train_prm(model, tok, read_labels(args.data), spec,
                       PRMTrainSettings(args.epochs, args.lr, args.batch, args.label, args.heldout, args.seed))
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    tok.save_pretrained(args.out)
    spec.write(args.out)
    (args.out / "prm_train.json").write_text(json.dumps({"data": str(args.data), **result}, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    commands = {"label": _label, "train": _train}
    if argv[0] not in commands:
        print(f"grpo prm: unknown command {argv[0]!r}\n{USAGE}")
        return 2
    return commands[argv[0]](argv[1:])
