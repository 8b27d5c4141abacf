"""The `grpo` command: train, sft, eval, data, audit, compare, report, toy, control, and the serving commands."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grpo.registry import Registry

# name -> (argv after the command) -> exit code; each command registers itself below with the line
# `grpo --help` prints for it
COMMANDS: Registry = Registry("command", field="grpo")


def usage() -> str:
    """The top-level help: every registered command with its line."""
    width = max(len(name) for name in COMMANDS)
    lines = [f"  {e.name:<{width}}  {e.doc}" for e in COMMANDS.entries()]
    return ("usage: grpo <command> [options] [key=value ...]\n\ncommands:\n" + "\n".join(lines)
            + "\n\nAny config key can be set as key=value; `grpo train --help` lists them by section,\n"
            "`grpo train --help SECTION` one section (e.g. rewards).")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] not in COMMANDS:
        print(f"{COMMANDS.unknown(argv[0])}\n\n{usage()}", file=sys.stderr)
        return 2
    from grpo.errors import GrpoError
    from grpo.infra.quiet import quiet_dependencies

    quiet_dependencies()  # before any command imports them

    try:
        return COMMANDS[argv[0]](argv[1:]) or 0
    except (GrpoError, FileNotFoundError, FloatingPointError) as e:
        print(f"grpo {argv[0]}: error: {e}", file=sys.stderr)
        return 2


class _SectionHelp(argparse.Action):
    """-h/--help [SECTION]: the options and every config key by section, or one section's keys."""

    def __call__(self, parser, namespace, values, option_string=None):
        from grpo.config.io import keys_help, recipes_help
        from grpo.config.sections import SECTIONS

        if values is None:
            parser.print_help()
            print("\nconfig keys by section (set as key=value; TRL's GRPOConfig names are read too, docs/guides/trl.md; "
                  f"`{parser.prog} --help SECTION` prints one of: {', '.join(s.name for s in SECTIONS)}; "
                  "`--help recipes` the published recipes):\n")
            print(keys_help())
            parser.exit()
        if values == "recipes":
            print(recipes_help())
            parser.exit()
        try:
            print(keys_help(values))
        except KeyError as e:
            parser.error(e.args[0])
        parser.exit()


def _config_parser(prog: str, description: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=description, add_help=False)
    ap.add_argument("-h", "--help", action=_SectionHelp, nargs="?", metavar="SECTION", default=argparse.SUPPRESS,
                    help="show this help and every config key by section, or one section's keys "
                         "(e.g. --help rewards), and exit")
    ap.add_argument("--config", help="YAML file of config keys; key=value arguments override it")
    ap.add_argument("overrides", nargs="*", metavar="key=value")
    return ap


def _train(argv: list[str]) -> int:
    from grpo.config.io import load_config

    ap = _config_parser("grpo train", "Fine-tune a causal LM with GRPO.")
    ap.add_argument("--resume", metavar="RUN_DIR", help="continue RUN_DIR exactly from its latest checkpoint "
                    "(its config.yaml is the base; key=value may still override, e.g. max_steps)")
    args = ap.parse_args(argv)
    cfg = load_config(*_resumed(args.config, list(args.overrides), args.resume))
    if cfg.launcher == "ray":  # the trainer ranks, rollout and reward workers on a Ray cluster (grpo/cluster)
        from grpo.cluster.driver import train_on_ray

        out = train_on_ray(cfg)
        print(f"run folder: {out['run_dir']}", flush=True)
        _print_summary(out["result"], steps=out["steps"], cfg=out["cfg"], run_dir=Path(out["run_dir"]))
        result = out["result"]
        return 130 if result.get("interrupted") == "SIGINT" else 143 if result.get("interrupted") else 0
    from grpo.train.trainer import Trainer

    from grpo.infra.distributed import close_world

    trainer = Trainer(cfg)
    world, run_dir = trainer.world, trainer.run_dir
    main = world.is_main  # under torchrun, rank 0 speaks for the run
    if main:
        print(f"run folder: {run_dir}", flush=True)
    if main and trainer.resumed_from:
        print(f"resumed from {trainer.resumed_from} at step {trainer.step}", flush=True)
    finished = False
    try:
        result = trainer.train()
        finished = True
    finally:
        steps, cfg = trainer.step, trainer.cfg
        del trainer  # the policy's FSDP2 state holds the process group: freed before the group closes
        close_world(world, finished=finished)
    if main:
        _print_summary(result, steps=steps, cfg=cfg, run_dir=run_dir)
    return 130 if result.get("interrupted") == "SIGINT" else 143 if result.get("interrupted") else 0


COMMANDS.register("train", _train, doc="fine-tune a model with GRPO (no arguments: SmolLM2-135M-Instruct on built-in arithmetic)")


def _sft(argv: list[str]) -> int:
    from grpo.config.io import load_config
    from grpo.errors import ConfigError
    from grpo.infra import distributed
    from grpo.infra.runtime import make_run_dir
    from grpo.sft.command import run_sft

    ap = _config_parser("grpo sft", "Supervised fine-tuning on the assistant's tokens of chat or "
                        "prompt/completion rows (sft_data=FILE).")
    ap.add_argument("--resume", metavar="RUN_DIR", help="continue RUN_DIR exactly from its latest checkpoint "
                    "(its config.yaml is the base; key=value may still override, e.g. sft_epochs)")
    args = ap.parse_args(argv)
    cfg = load_config(*_resumed(args.config, list(args.overrides), args.resume))
    if not cfg.sft_data:
        raise ConfigError("sft_data: name the .jsonl / .json file of chat or prompt/completion rows to train on")
    if cfg.num_train_epochs is not None:
        raise ConfigError(f"num_train_epochs: grpo sft counts its passes in sft_epochs; give sft_epochs="
                          f"{cfg.num_train_epochs:g} instead")
    if cfg.num_threads:
        import torch

        torch.set_num_threads(cfg.num_threads)
    world = distributed.init_world()  # torchrun's environment, or one process
    if world.distributed and cfg.distributed_strategy != "ddp":
        raise ConfigError(f"distributed_strategy: grpo sft runs on several processes with ddp only, "
                          f"got {cfg.distributed_strategy!r}")
    finished = False
    try:
        run_dir = distributed.broadcast_object(make_run_dir(cfg.output_dir, cfg.resume_from_checkpoint, command="grpo sft")
                                           if world.is_main else None, world)
        if world.is_main:
            cfg.save(run_dir / "config.yaml")  # the run's model: the base a LoRA checkpoint is merged into
        result = run_sft(_sft_model_settings(cfg), _sft_settings(cfg, run_dir), world=world)
        finished = True
    finally:
        distributed.close_world(world, finished=finished)
    if world.is_main:
        print(json.dumps(result, indent=2))
        if "final" in result:
            print(f"start GRPO from it: grpo train model={result['final']}")
        else:
            print(f"{result['interrupted']}: saved {result['checkpoint']}; continue with grpo sft --resume {run_dir}")
    return 130 if result.get("interrupted") == "SIGINT" else 143 if result.get("interrupted") else 0


COMMANDS.register("sft", _sft, doc="supervised fine-tuning on chat or prompt/completion rows (grpo sft sft_data=FILE.jsonl)")


def _resumed(config_path: str | None, overrides: list[str], resume: str | None) -> tuple:
    """The config file and overrides of a command with ``--resume RUN_DIR``: the run folder's
    config.yaml as the base (unless --config names another), continued in that folder."""
    if not resume:
        return config_path, overrides
    run = Path(resume)
    if config_path is None:
        config_path = run / "config.yaml"
        if not config_path.is_file():
            raise FileNotFoundError(f"--resume {run}: no config.yaml there (is it a run folder?)")
    return config_path, overrides + [f"output_dir={run}", f"resume_from_checkpoint={run}"]


def _sft_model_settings(cfg):
    """What ``grpo sft`` loads: the config's fields of the same names."""
    from grpo.sft import SFTModelSettings

    return SFTModelSettings(model=cfg.model, dtype=cfg.dtype, bf16=cfg.bf16, use_peft=cfg.use_peft, lora_r=cfg.lora_r,
                            lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                            lora_target_modules=cfg.lora_target_modules, load_in_4bit=cfg.load_in_4bit,
                            gradient_checkpointing=cfg.gradient_checkpointing,
                            chat_template_kwargs=cfg.chat_template_kwargs)


def _sft_settings(cfg, run_dir: Path):
    """The supervised run: its sft_* fields, the optimizer's and schedule's, and the run folder's."""
    from grpo.infra.trackers import tracker_names
    from grpo.sft import SFTSettings

    return SFTSettings(data=cfg.sft_data, run_dir=run_dir, epochs=cfg.sft_epochs, batch_size=cfg.sft_batch_size,
                       micro_batch=cfg.per_device_train_batch_size, max_length=cfg.sft_max_length,
                       eval_share=cfg.sft_eval_share, learning_rate=cfg.learning_rate,
                       lr_scheduler_type=cfg.lr_scheduler_type, warmup_steps=cfg.warmup_steps,
                       weight_decay=cfg.weight_decay, adam_beta1=cfg.adam_beta1, adam_beta2=cfg.adam_beta2,
                       max_grad_norm=cfg.max_grad_norm, seed=cfg.seed, save_steps=cfg.save_steps,
                       save_total_limit=cfg.save_total_limit, logging_steps=cfg.logging_steps,
                       report_to=tuple(tracker_names(cfg.report_to)), progress=cfg.progress, packing=cfg.sft_packing,
                       resume_from_checkpoint=cfg.resume_from_checkpoint)


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
        print(f"held-out greedy accuracy on {b.get('n_prompts', result.get('n_prompts'))} prompts: {b['accuracy']:.1%} -> {a['accuracy']:.1%} "
              f"({(a['accuracy'] - b['accuracy']) * 100:+.1f} points)")
        if b.get("pass@k") is not None and a.get("pass@k") is not None:
            print(f"pass@{b.get('k')} on {b.get('pass_prompts', '?')} prompts: {b['pass@k']:.1%} -> {a['pass@k']:.1%}")
        _print_truncation(b, a, cfg.eval_max_new_tokens)
    print(f"run files: {run_dir}/ (config.yaml, metrics.jsonl, samples.jsonl, eval.json, "
          f"checkpoints/, tensorboard/); plots and an HTML page: grpo report {run_dir}")


def _print_truncation(before: dict, after: dict, limit: int) -> None:
    """The share of greedy answers cut at the evaluation's token limit, before and after: an accuracy
    that rose while answers stopped being cut may only mean shorter answers, so the two go together."""
    b, a = before.get("truncated_share"), after.get("truncated_share")
    if b is None or a is None:
        return
    print(f"greedy answers cut at eval_max_new_tokens={limit}: {b:.1%} -> {a:.1%}; mean length "
          f"{before.get('mean_length', 0):.1f} -> {after.get('mean_length', 0):.1f} tokens")
    if max(a, b) >= 0.05:
        print(f"note: {max(a, b):.0%} of the answers were cut before they ended, so part of the change in accuracy "
              f"may be answers that now fit rather than better ones; raise max_completion_length (the evaluation "
              f"follows it) to score whole answers")


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
    from grpo.config.mixture_settings import mixture_of
    from grpo.errors import ConfigError

    if mixture_of(cfg) is not None:
        raise ConfigError(f"task {cfg.task!r} is a mixture; evaluate one of its tasks with --task NAME")
    import os

    from grpo.infra.runtime import import_from
    from grpo.models import load_models
    from grpo.rewards import resolve_reward
    from grpo.rollout import engine_class, make_engine
    from grpo.train.settings import engine_options, reward_options

    import_from(cfg.working_dir, os.getcwd())  # the run's own folder first: its modules, as in training
    verifier = resolve_reward(cfg.reward_names[0], reward_options(cfg))
    samples, held_out = _eval_samples(cfg, run)
    models = load_models(cfg.model, dtype=cfg.dtype, need_reference=False,
                         chat_template_kwargs=cfg.chat_template_kwargs)
    # the engine evaluation inside `train` samples with: the run's where it serves evaluation (vLLM; a shared
    # server's engine in this process), else generate
    run_engine = engine_class(cfg.rollout_engine)
    name = (run_engine.standalone or cfg.rollout_engine) if run_engine.serves_evaluation else "hf"
    engine = make_engine(name, models.policy, models.tokenizer, kernels=cfg.decode_kernels,
                         options=engine_options(cfg, name))
    try:
        res, stopped = _evaluate_until_signal(engine, samples, verifier, cfg, models.tokenizer)
    finally:
        engine.close()
    res.pop("examples", None)
    print(json.dumps({"model": cfg.model, "task": cfg.task, **held_out, **res}, indent=2))
    return {None: 0, "SIGINT": 130}.get(stopped, 143)


COMMANDS.register("eval", _eval, doc="greedy accuracy and pass@k of a model or run folder on a task's held-out prompts")


def _trained_rows(cfg) -> list[dict]:
    """The rows a run trained on: its task's, or every source's of a mixture."""
    from grpo.train.settings import task_of
    from grpo.train.settings import sources_settings
    from grpo.train.sources import source_task

    settings = sources_settings(cfg)
    if settings.mixture is None:
        return task_of(cfg).train
    return [row for spec in settings.mixture for row in source_task(settings, spec)[0].train]


def _eval_samples(cfg, run: Path | None) -> tuple[list[dict], dict]:
    """The task's held-out samples, less any prompt the run folder ``run`` trained on (an
    eval_prompts above the run's own reaches into its training split): those are not scored, and
    the output says how many were asked for and left out."""
    from grpo.config.io import load_config
    from grpo.train.settings import task_of
    from grpo.data.tasks import unseen

    samples = task_of(cfg).eval
    if run is None:
        return samples, {}
    kept = unseen(samples, _trained_rows(load_config(run / "config.yaml")))
    if len(kept) == len(samples):
        return samples, {}
    print(f"grpo eval: {len(samples) - len(kept)} of the {len(samples)} prompts asked for (eval_prompts="
          f"{cfg.eval_prompts}) are prompts {run} trained on: they are left out, {len(kept)} held-out prompts "
          f"are evaluated", file=sys.stderr, flush=True)
    return kept, {"eval_prompts_requested": len(samples), "training_prompts_left_out": len(samples) - len(kept)}


def _evaluate_until_signal(engine, samples: list[dict], verifier, cfg, tokenizer) -> tuple[dict, str | None]:
    """The evaluation the config asks for, which SIGINT or SIGTERM ends at once (the result then covers
    the prompts scored before, marked "interrupted"); also the signal's name, or None."""
    import signal

    from grpo.agent import AgentSampler
    from grpo.eval.evaluate import Interrupt, evaluate
    from grpo.infra.stop import StopFlag
    from grpo.train.settings import agent_settings, eval_settings

    stop = StopFlag()
    handlers = {s: signal.signal(s, stop.handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        res = evaluate(engine, samples, verifier, eval_settings(cfg),
                       agent=AgentSampler.from_settings(agent_settings(cfg), tokenizer),
                       interrupt=Interrupt(requested=lambda: stop.signal is not None, abortable=stop.abortable))
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    return res, stop.signal


def _data(argv: list[str]) -> int:
    from grpo.commands.data_filter import main as data_main

    return data_main(argv)


def _prm(argv: list[str]) -> int:
    from grpo.commands.prm import main as prm_main

    return prm_main(argv)


COMMANDS.register("prm", _prm, doc="`grpo prm label` / `grpo prm train`: a process reward model from the policy's own "
                  "step labels (Math-Shepherd), for step_reward=prm:FOLDER")
COMMANDS.register("data", _data, doc="`grpo data filter`: problems with >= 3 logical steps, anchor answers by pairwise win rate (JSONL)")


def _audit(argv: list[str]) -> int:
    from grpo.commands.audit import main as audit_main

    return audit_main(argv)


COMMANDS.register("audit", _audit, doc="reasoning-chain audit: four defect densities per 100 tokens, a run's trained and base model (grpo audit RUN)")


def _compare(argv: list[str]) -> int:
    from grpo.commands.compare import main as compare_main

    return compare_main(argv)


COMMANDS.register("compare", _compare, doc="GRPO vs RLOO vs REINFORCE vs PPO with a critic: memory, step time, accuracy (own subprocesses)")


def _report(argv: list[str]) -> int:
    from grpo.commands.report import main as report_main

    return report_main(argv)


COMMANDS.register("report", _report, doc="PNG plots and an HTML page of one or more run folders (grpo report RUN_DIR [RUN_DIR ...])")


def _toy(argv: list[str]) -> int:
    from grpo.commands.toy import main as toy_main

    toy_main(argv)
    return 0


COMMANDS.register("toy", _toy, doc="GRPO vs REINFORCE on the seeds' target-matching toy (no language model)")


def _control(argv: list[str]) -> int:
    try:
        from grpo.pathtracking.commands import main as control_main
    except ModuleNotFoundError as e:  # gymnasium / SB3 come with the optional extra
        from grpo.errors import ConfigError

        raise ConfigError(f"needs the control extra: pip install -e '.[control]' ({e})") from None
    return control_main(argv)


COMMANDS.register("control", _control, doc="vehicle path tracking: `grpo control train --algo grpo|ppo|trpo`, `grpo control compare`")


def _serving(name: str):
    def run(argv: list[str]) -> int:
        import importlib

        module = {"bench_main": "grpo.serve.bench", "vllm_serve_main": "grpo.rollout.vllm.server"}.get(name, "grpo.serve.server")
        return getattr(importlib.import_module(module), name)(argv)

    return run


COMMANDS.register("export", _serving("export_main"),
                  doc="a run's newest checkpoint as a plain transformers folder, LoRA merged (grpo export RUN --out DIR)")


COMMANDS.register("serve", _serving("serve_main"),
                  doc="an OpenAI-compatible API: the GRPO model first, a fallback model past a deadline (grpo serve RUN)")


COMMANDS.register("vllm-serve", _serving("vllm_serve_main"),
                  doc="a vLLM engine for rollout_engine=vllm_server (grpo vllm-serve MODEL --port 8000)")


COMMANDS.register("serve-bench", _serving("bench_main"),
                  doc="load test of a running `grpo serve` (grpo serve-bench --url URL --concurrency 1,4,16)")


if __name__ == "__main__":
    sys.exit(main())
