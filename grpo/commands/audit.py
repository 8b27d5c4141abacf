"""`grpo audit RUN`: the reasoning-chain audit of a run's trained model beside its base model, on
the same held-out problems, written to the run folder (audit.json, audit_samples.jsonl) and shown by
`grpo report`. `grpo audit --model M --out DIR` audits any model `grpo train` accepts. The audit itself
is grpo/audit; this is its command line."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict
from pathlib import Path

from grpo.audit.run import INSTRUCTIONS, AuditSettings, audit_model, format_table, pick_problems, write_audit
from grpo.errors import ConfigError


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="grpo audit", description=(
        "Four defect densities per 100 tokens (step completeness, step order, symbol consistency, calculation "
        "accuracy) of numbered-step answers on held-out problems (docs/guides/audit.md)."))
    ap.add_argument("run", nargs="?", help="run folder: audits its trained model and its base model side by side")
    ap.add_argument("--model", help="audit this model instead (hub id, folder, run folder); needs --out without RUN")
    ap.add_argument("--task", help="task (default: the run's, else arithmetic)")
    ap.add_argument("--no-base", action="store_true", help="with RUN: audit the trained model only")
    ap.add_argument("--problems", type=int, default=50, help="held-out problems drawn at random (default 50)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the problem draw (default 0)")
    ap.add_argument("--language", choices=sorted(INSTRUCTIONS), default="en", help="language of the step instruction")
    ap.add_argument("--max-new-tokens", type=int, default=256, help="token limit of each answer (default 256)")
    ap.add_argument("--batch-size", type=int, default=25, help="prompts per generate call (default 25)")
    ap.add_argument("--out", help="folder for audit.json and audit_samples.jsonl (default: RUN)")
    ap.add_argument("overrides", nargs="*", metavar="key=value", help="config keys, as for grpo eval")
    return ap


def _models(args, base_model: str) -> dict[str, str]:
    """The models to audit by label: trained and base (``base_model``, the run's ``model``) for a run
    folder, else the one given."""
    if args.model:
        return {"model": args.model}
    models = {"trained": str(args.run)}
    if not args.no_base:
        models["base"] = base_model
    return models


def main(argv: list[str]) -> int:
    from grpo.config.io import load_config
    from grpo.train.settings import task_of
    from grpo.data.tasks import unseen
    from grpo.infra.runtime import import_from
    from grpo.models import load_models
    from grpo.rewards import resolve_reward
    from grpo.rollout import make_engine
    from grpo.train.settings import reward_options

    args = _parser().parse_args(argv)
    if args.run and "=" in args.run and not Path(args.run).exists():  # no RUN: the first key=value
        args.overrides, args.run = [args.run, *args.overrides], None
    run = Path(args.run) if args.run else None
    if run is not None and not (run / "config.yaml").is_file():
        raise ConfigError(f"{run} is not a run folder (no config.yaml); use --model M --out DIR")
    if run is None and not (args.model and args.out):
        raise ConfigError("give a run folder, or --model M and --out DIR")
    overrides = list(args.overrides) + ([f"task={args.task}"] if args.task else [])
    cfg = load_config(run / "config.yaml" if run else None, overrides)
    import_from(cfg.working_dir, os.getcwd())
    verifier = resolve_reward(cfg.reward_names[0], reward_options(cfg))
    task = task_of(cfg)
    held_out = unseen(task.eval, task.train)
    settings = AuditSettings(problems=args.problems, seed=args.seed, language=args.language,
                             max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                             system_prompt=cfg.system_prompt, max_prompt_length=max(cfg.max_prompt_length, 512))
    problems = pick_problems(held_out, settings.problems, settings.seed)
    results = {}
    labels = _models(args, cfg.model)
    for label, name in labels.items():
        models = load_models(name, dtype=cfg.dtype, need_reference=False,
                             chat_template_kwargs=cfg.chat_template_kwargs)
        engine = make_engine("hf", models.policy, models.tokenizer)
        try:
            results[label] = audit_model(engine, problems, verifier, settings, verifier_name=cfg.reward_names[0])
        finally:
            engine.close()
        print(f"audited {label} ({name}): accuracy {results[label][0]['accuracy']:.1%} on {len(problems)} problems",
              flush=True)
    meta = {"task": cfg.task, "verifier": cfg.reward_names[0], "settings": asdict(settings),
            "labels": labels}
    path = write_audit(Path(args.out) if args.out else run, results, meta)
    print(format_table(json.loads(path.read_text())))
    print(f"written: {path} and {path.parent / 'audit_samples.jsonl'}")
    return 0
