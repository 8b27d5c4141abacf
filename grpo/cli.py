"""The `grpo` command: train, eval, compare, report, toy, control."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

USAGE = """usage: grpo <command> [options] [key=value ...]

commands:
  train   fine-tune a model with GRPO (no arguments: SmolLM2-135M-Instruct on built-in arithmetic)
  eval    greedy accuracy and pass@k of a model or run folder on a task's held-out prompts
  data    `grpo data filter`: problems with >= 3 logical steps, anchor answers by pairwise win rate (JSONL)
  audit   reasoning-chain audit: four defect densities per 100 tokens, a run's trained and base model (grpo audit RUN)
  compare GRPO vs RLOO vs REINFORCE vs PPO with a critic: memory, step time, accuracy (own subprocesses)
  report  PNG plots and an HTML page of one or more run folders (grpo report RUN_DIR [RUN_DIR ...])
  toy     GRPO vs REINFORCE on the seeds' target-matching toy (no language model)
  control vehicle path tracking: `grpo control train --algo grpo|ppo|trpo`, `grpo control compare`
  export  a run's newest checkpoint as a plain transformers folder, LoRA merged (grpo export RUN --out DIR)
  serve   an OpenAI-compatible API: the GRPO model first, a fallback model past a deadline (grpo serve RUN)
  vllm-serve   a vLLM engine for rollout_backend=vllm_server (grpo vllm-serve MODEL --port 8000)
  serve-bench  load test of a running `grpo serve` (grpo serve-bench --url URL --concurrency 1,4,16)

Any config key can be set as key=value; `grpo train --help` lists them."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"train": _train, "eval": _eval, "compare": _compare, "report": _report, "toy": _toy,
                "control": _control, "export": _serving("export_main"), "serve": _serving("serve_main"),
                "serve-bench": _serving("bench_main"), "vllm-serve": _serving("vllm_serve_main"),
                "audit": _audit, "data": _data}
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if argv[0] not in commands:
        print(f"grpo: unknown command {argv[0]!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    from grpo.errors import GrpoError

    try:
        return commands[argv[0]](argv[1:]) or 0
    except (GrpoError, FileNotFoundError, FloatingPointError) as e:
        print(f"grpo {argv[0]}: error: {e}", file=sys.stderr)
        return 2


def _config_parser(prog: str, description: str) -> argparse.ArgumentParser:
    import dataclasses

    from grpo.config import Config
    from grpo.config.io import field_docs

    docs = field_docs()
    defaults = {f.name: f.default for f in dataclasses.fields(Config)}
    epilog = ("config keys (set as key=value; TRL's GRPOConfig names are read too, docs/trl.md):\n"
              + "\n".join(f"  {k:<28} {v} (default: {defaults[k]!r})" for k, v in docs.items()))
    ap = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="YAML file of config keys; key=value arguments override it")
    ap.add_argument("overrides", nargs="*", metavar="key=value")
    return ap


def _train(argv: list[str]) -> int:
    from grpo.config.io import load_config

    ap = _config_parser("grpo train", "Fine-tune a causal LM with GRPO.")
    ap.add_argument("--resume", metavar="RUN_DIR", help="continue RUN_DIR exactly from its latest checkpoint "
                    "(its config.yaml is the base; key=value may still override, e.g. max_steps)")
    args = ap.parse_args(argv)
    config_path, overrides = args.config, list(args.overrides)
    if args.resume:
        run = Path(args.resume)
        if config_path is None:
            config_path = run / "config.yaml"
            if not config_path.is_file():
                raise FileNotFoundError(f"--resume {run}: no config.yaml there (is it a run folder?)")
        overrides += [f"output_dir={run}", f"resume_from_checkpoint={run}"]
    cfg = load_config(config_path, overrides)
    from grpo.train.trainer import Trainer

    from grpo.infra.distributed import close_world

    trainer = Trainer(cfg)
    main = trainer.world.is_main  # under torchrun, rank 0 speaks for the run
    if main:
        print(f"run folder: {trainer.run_dir}", flush=True)
    if main and trainer.resumed_from:
        print(f"resumed from {trainer.resumed_from} at step {trainer.step}", flush=True)
    try:
        result = trainer.train()
    finally:
        close_world(trainer.world)
    if main:
        _print_summary(result, steps=trainer.step, cfg=trainer.cfg, run_dir=trainer.run_dir)
    return 130 if result.get("interrupted") == "SIGINT" else 143 if result.get("interrupted") else 0


def _print_summary(result: dict, *, steps: int, cfg, run_dir) -> None:
    print(f"\ntrained {steps} steps ({cfg.prompts_per_step} prompts x {cfg.num_generations} completions each)")
    partial = [w for w in ("before", "after") if result.get(w, {}).get("interrupted")]
    for when in partial:
        r = result[when]
        on = f" (accuracy {r['accuracy']:.1%} on those)" if r["prompts_scored"] else ""
        print(f"the {when}-training evaluation was interrupted: {r['prompts_scored']} of {r['n_prompts']} held-out "
              f"prompts scored{on}; marked in eval.json")
    if "before" in result and "after" in result and not partial:
        b, a = result["before"], result["after"]
        k = b.get("k")
        print(f"held-out greedy accuracy on {result['n_prompts']} prompts: {b['accuracy']:.1%} -> {a['accuracy']:.1%} "
              f"({(a['accuracy'] - b['accuracy']) * 100:+.1f} points)")
        if b.get("pass@k") is not None:
            print(f"pass@{k} on {b['pass_prompts']} prompts: {b['pass@k']:.1%} -> {a['pass@k']:.1%}")
    print(f"run files: {run_dir}/ (config.yaml, metrics.jsonl, samples.jsonl, eval.json, "
          f"checkpoints/, tensorboard/); plots and an HTML page: grpo report {run_dir}")


def _eval(argv: list[str]) -> int:
    from grpo.config.io import load_config

    ap = _config_parser("grpo eval", "Greedy accuracy and pass@k on a task's held-out prompts.")
    ap.add_argument("--model", help="hub id, model folder, or run folder (default: the config's model)")
    ap.add_argument("--task", help="task (default: the run's task, else the config's)")
    args = ap.parse_args(argv)
    run = Path(args.model) if args.model and (Path(args.model) / "config.yaml").is_file() else None
    config_path = args.config
    if config_path is None and run is not None:
        config_path = run / "config.yaml"  # a run folder: evaluate as it was trained
    overrides = list(args.overrides)
    if args.model:
        overrides.append(f"model={args.model}")
    if args.task:
        overrides.append(f"task={args.task}")
    cfg = load_config(config_path, overrides)
    import os

    from grpo.infra.runtime import import_from
    from grpo.models import load_models
    from grpo.rewards import resolve_reward
    from grpo.rollout import make_engine

    import_from(cfg.working_dir, os.getcwd())  # the run's own folder first: its modules, as in training
    verifier = resolve_reward(cfg.reward_names[0], timeout=cfg.reward_timeout, retries=cfg.reward_retries,
                              concurrency=cfg.reward_concurrency)
    samples, held_out = _eval_samples(cfg, run)
    models = load_models(cfg.model, dtype=cfg.dtype, need_reference=False)
    engine = make_engine("hf", models.policy, models.tokenizer)  # generate, as evaluation inside `train`
    try:
        res, stopped = _evaluate_until_signal(engine, samples, verifier, cfg, models.tokenizer)
    finally:
        engine.close()
    res.pop("examples", None)
    print(json.dumps({"model": cfg.model, "task": cfg.task, **held_out, **res}, indent=2))
    return {None: 0, "SIGINT": 130}.get(stopped, 143)


def _eval_samples(cfg, run: Path | None) -> tuple[list[dict], dict]:
    """The task's held-out samples, less any prompt the run folder ``run`` trained on (an
    eval_prompts above the run's own reaches into its training split): those are not scored, and
    the output says how many were asked for and left out."""
    from grpo.config.io import load_config
    from grpo.data import task_of
    from grpo.data.tasks import unseen

    samples = task_of(cfg).eval
    if run is None:
        return samples, {}
    kept = unseen(samples, task_of(load_config(run / "config.yaml")).train)
    if len(kept) == len(samples):
        return samples, {}
    print(f"grpo eval: {len(samples) - len(kept)} of the {len(samples)} prompts asked for (eval_prompts="
          f"{cfg.eval_prompts}) are prompts {run} trained on: they are left out, {len(kept)} held-out prompts "
          f"are evaluated", file=sys.stderr, flush=True)
    return kept, {"eval_prompts_requested": len(samples), "training_prompts_left_out": len(samples) - len(kept)}


def _evaluate_until_signal(engine, samples: list[dict], verifier, cfg, tokenizer) -> tuple[dict, str | None]:
    """evaluate_as_configured, which SIGINT or SIGTERM ends at once (the result then covers the prompts
    scored before, marked "interrupted"); also the signal's name, or None."""
    import signal

    from grpo.agent import AgentSampler
    from grpo.eval.evaluate import Interrupt, evaluate_as_configured
    from grpo.infra.stop import StopFlag

    stop = StopFlag()
    handlers = {s: signal.signal(s, stop.handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        res = evaluate_as_configured(engine, samples, verifier, cfg, agent=AgentSampler.from_config(cfg, tokenizer),
                                     interrupt=Interrupt(requested=lambda: stop.signal is not None,
                                                         abortable=stop.abortable))
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    return res, stop.signal


def _audit(argv: list[str]) -> int:
    from grpo.audit.command import main as audit_main

    return audit_main(argv)


def _data(argv: list[str]) -> int:
    from grpo.tools.data_filter import main as data_main

    return data_main(argv)


def _compare(argv: list[str]) -> int:
    from grpo.tools.compare import main as compare_main

    return compare_main(argv)


def _report(argv: list[str]) -> int:
    from grpo.tools.report import main as report_main

    return report_main(argv)


def _toy(argv: list[str]) -> int:
    from grpo.tools.toy import main as toy_main

    toy_main(argv)
    return 0


def _control(argv: list[str]) -> int:
    try:
        from grpo.control.commands import main as control_main
    except ModuleNotFoundError as e:  # gymnasium / SB3 come with the optional extra
        from grpo.errors import ConfigError

        raise ConfigError(f"needs the control extra: pip install -e '.[control]' ({e})") from None
    return control_main(argv)


def _serving(name: str):
    def run(argv: list[str]) -> int:
        import importlib

        module = {"bench_main": "grpo.serve.bench", "vllm_serve_main": "grpo.serve.vllm_serve"}.get(name, "grpo.serve.server")
        return getattr(importlib.import_module(module), name)(argv)

    return run


if __name__ == "__main__":
    sys.exit(main())
