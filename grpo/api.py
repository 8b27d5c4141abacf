"""The Python API, shaped as TRL's: a TRL GRPO script runs with its import line changed.

    from grpo import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir="runs/mine", max_steps=20, gradient_accumulation_steps=2)
    trainer = GRPOTrainer(model="HuggingFaceTB/SmolLM2-135M-Instruct", reward_funcs=[my_reward], args=args,
                          train_dataset=dataset)
    trainer.train()

It runs what ``grpo train`` runs: ``GRPOConfig`` reads grpo's names and TRL's (docs/guides/trl.md) into a
grpo ``Config``; a dataset object (a ``datasets.Dataset`` or a list of dicts with a ``prompt``
column) is written to the run folder as ``train_dataset.jsonl`` and becomes the run's ``task``, so the
run's config.yaml repeats it, and ``grpo eval`` and ``grpo train --resume`` work on the run folder
(rows that are not JSON, or an ``eval_dataset``: the run resumes through this API only); reward
callables run in this process (either form, grpo.rewards.forms) and are recorded in the config as
``module:name`` (a script's own functions as ``__main__:name``).
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from grpo.config import Config
from grpo.config.io import config_from
from grpo.data.tasks import Task, rows_task, task_rewards
from grpo.errors import ConfigError, DataError
from grpo.infra.runtime import make_run_dir
from grpo.rewards.builtin import REWARDS
from grpo.rewards.remote import is_url


def GRPOConfig(**kwargs) -> Config:  # noqa: N802 (TRL's name: it reads like TRL's class)
    """A grpo Config from keyword arguments with grpo's names or TRL's GRPOConfig names (docs/guides/trl.md:
    mapped onto grpo's fields, refused naming grpo's equivalent, or ignored)."""
    return config_from(kwargs, "GRPOConfig(...)")


# what TRL's AsyncGRPOTrainer trains: asynchronous rollouts up to 4 steps stale, the token-level clipped loss
# normalised by the batch's tokens, no KL term (trl.experimental.async_grpo, TRL 1.16.0)
ASYNC_DEFAULTS = {"async_rollouts": True, "max_staleness": 4, "aggregation": "token_mean", "beta": 0.0}


def AsyncGRPOConfig(**kwargs) -> Config:  # noqa: N802 (TRL's name: it reads like TRL's class)
    """``GRPOConfig`` with TRL's AsyncGRPOConfig names too (max_staleness, request_timeout, token_budget, ...)
    and what its trainer trains where not given: async_rollouts, max_staleness=4, aggregation=token_mean, beta=0."""
    given = dict(kwargs)
    for key, value in ASYNC_DEFAULTS.items():
        if key not in given and not (key == "aggregation" and "loss_type" in given):
            given[key] = value
    return config_from(given, "AsyncGRPOConfig(...)")


def callable_name(fn: Callable) -> str | None:
    """``module:qualname`` when that path finds ``fn`` itself (a module-level function or class), else None."""
    import importlib

    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or "<" in qualname:
        return None
    try:
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    return f"{module}:{qualname}" if obj is fn else None


def _rewards_follow_task(cfg: Config, changes: dict) -> dict:
    """``changes`` with ``rewards`` emptied where they replace the task and leave the rewards that
    ``cfg``'s own task filled in (a GRPOConfig() holds the default arithmetic task's): the new task's
    (a dataset's: numeric) then apply, as on the command line."""
    if "task" not in changes or changes["task"] == cfg.task or "rewards" in changes or not isinstance(cfg.task, str):
        return changes
    return {**changes, "rewards": ""} if cfg.rewards == task_rewards(cfg.task) else changes


def _reward_names(reward_funcs) -> tuple[list[str], dict[str, Callable], str]:
    """(names for the config, name -> callable, a reward model id or ''). A string is a built-in,
    ``module:function`` or a URL, or else (as in TRL) a sequence-classification model's id or folder."""
    funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    names, given, reward_model = [], {}, ""
    for fn in funcs:
        if isinstance(fn, str):
            if fn in REWARDS or ":" in fn or is_url(fn):
                names.append(fn)
            elif reward_model:
                raise ConfigError("reward_funcs: grpo scores with one reward model; two model ids were given")
            else:
                names.append("reward_model")
                reward_model = fn
            continue
        if not callable(fn) or hasattr(fn, "parameters") and hasattr(fn, "config"):
            raise ConfigError(f"reward_funcs: {fn!r:.60} is not a function; give a reward model by its id or folder")
        name = callable_name(fn) or getattr(fn, "__name__", type(fn).__name__)
        while name in given or name in names:
            name += "'"
        names.append(name)
        given[name] = fn
    if not names:
        raise ConfigError("reward_funcs: give at least one reward")
    return names, given, reward_model


def _spec(items, where: str) -> str:
    """Tools or an environment class as the config's comma-separated module:name references; a dict
    (TRL's environment_factory routed by a column) as value=module:name entries."""
    if isinstance(items, dict):
        return ",".join(f"{key}={_spec(value, where)}" for key, value in items.items())
    out = []
    for item in items if isinstance(items, (list, tuple)) else [items]:
        name = item if isinstance(item, str) else callable_name(item)
        if name is None:
            raise ConfigError(f"{where}: {item!r:.60} must be a module-level function or class (found by "
                              f"module:name) or a module:name string")
        out.append(name)
    return ",".join(out)


def _peft(peft_config) -> dict:
    """A peft LoraConfig as grpo's LoRA fields."""
    targets = getattr(peft_config, "target_modules", None) or "all-linear"
    targets = targets if isinstance(targets, str) else ",".join(sorted(targets))
    return {"use_peft": True, "lora_r": peft_config.r, "lora_alpha": peft_config.lora_alpha,
            "lora_dropout": peft_config.lora_dropout, "lora_target_modules": targets}


def _rows(dataset, where: str) -> list[dict]:
    try:
        rows = [dict(r) for r in dataset]
    except (TypeError, ValueError):
        raise DataError(f"{where}: a datasets.Dataset, a list of dicts or a file path, not "
                        f"{type(dataset).__name__}") from None
    return rows


def _unsupported(**given) -> None:
    for key, value in given.items():
        if value not in (None, (), [], (None, None)):
            raise ConfigError(f"{key}: not taken by grpo's trainer (grpo loads the tokenizer with the model, "
                              f"keeps its own optimizer, schedule and sampling loop); leave it unset")


class GRPOTrainer:
    """TRL's ``GRPOTrainer`` signature over grpo's trainer (module docstring). ``model``: a hub id or
    folder (or a run folder); ``reward_funcs``: callables of either form, names, or a reward model's
    id; ``args``: a ``GRPOConfig(...)`` / ``Config``; ``train_dataset``: a dataset object or a
    ``task`` (file, hub id, built-in name); ``eval_dataset``: the held-out prompts instead of a split
    of the training rows; ``tools``: module-level functions; ``environment_factory``: a module-level
    class; ``peft_config``: a peft ``LoraConfig`` (LoRA training)."""

    def __init__(self, model: str | None = None, reward_funcs=None, args: Config | None = None,
                 train_dataset=None, eval_dataset=None, processing_class=None, reward_processing_classes=None,
                 callbacks=None, optimizers=(None, None), peft_config=None, tools=None, rollout_func=None,
                 environment_factory=None):
        _unsupported(processing_class=processing_class, reward_processing_classes=reward_processing_classes,
                     callbacks=callbacks, optimizers=optimizers, rollout_func=rollout_func)
        changes: dict[str, Any] = {}
        if model is not None:
            if not isinstance(model, str):
                raise ConfigError("model: give the model's hub id or folder (grpo loads the policy, its reference "
                                  "and tokenizer itself)")
            changes["model"] = model
        given: dict[str, Callable] = {}
        if reward_funcs is not None:
            names, given, reward_model = _reward_names(reward_funcs)
            changes.update(rewards=",".join(names), **({"reward_model": reward_model} if reward_model else {}))
        if tools:
            changes["tools"] = _spec(tools, "tools")
        if environment_factory is not None:
            changes["environment_factory"] = _spec(environment_factory, "environment_factory")
        if peft_config is not None:
            changes.update(_peft(peft_config))
        if isinstance(train_dataset, (str, Path)):
            changes["task"] = str(train_dataset)
        cfg = args if args is not None else Config()
        changes = _rewards_follow_task(cfg, changes)
        if cfg.reward_weights is not None and "rewards" in changes and len(cfg.reward_weights) != len(changes["rewards"].split(",")):
            raise ConfigError(f"reward_weights: {len(cfg.reward_weights)} weights for {len(changes['rewards'].split(','))} "
                              f"reward_funcs")
        cfg = Config(**{**dataclasses.asdict(cfg), **changes})  # validated again, with what was handed over
        self.task = None
        if train_dataset is not None and not isinstance(train_dataset, (str, Path)):
            cfg, self.task = self._dataset_task(cfg, _rows(train_dataset, "train_dataset"),
                                                None if eval_dataset is None else _rows(eval_dataset, "eval_dataset"))
        elif eval_dataset is not None:
            raise ConfigError("eval_dataset: give it with a train_dataset object (a task by name holds out its own)")
        self.reward_funcs = given
        from grpo.train.trainer import Trainer  # the loop, as `grpo train` runs it

        self.trainer = Trainer(cfg, task=self.task, reward_fns=given)

    @property
    def args(self) -> Config:
        """The run's config as the loop holds it (working_dir and an epochs' max_steps resolved): a
        max_steps raised here before train() trains further, as in TRL."""
        return self.trainer.cfg

    @staticmethod
    def _dataset_task(cfg: Config, rows: list[dict], eval_rows: list[dict] | None) -> tuple[Config, Task]:
        """The task of dataset rows, and the config with the run folder chosen and, where the rows are
        JSON, ``task`` the run folder's copy of them (so the run repeats and resumes from the CLI)."""
        run_dir = make_run_dir(cfg.output_dir or f"runs/{datetime.now():%Y%m%d-%H%M%S}", cfg.resume_from_checkpoint)
        changes = {"output_dir": str(run_dir)}
        if eval_rows is None:
            task = rows_task("train_dataset", rows, where="train_dataset", prompt_field=cfg.prompt_field,
                             answer_field=cfg.answer_field, eval_size=cfg.eval_prompts)
        else:  # every training row trains; the eval rows are the held-out set
            train = rows_task("train_dataset", rows, where="train_dataset", prompt_field=cfg.prompt_field,
                              answer_field=cfg.answer_field, eval_size=0)
            held = rows_task("eval_dataset", eval_rows, where="eval_dataset", prompt_field=cfg.prompt_field,
                             answer_field=cfg.answer_field, eval_size=0)
            task = Task("train_dataset", train=train.train, eval=held.train[:cfg.eval_prompts])
        changes["task"] = "train_dataset"  # a Python object: the run resumes through this API only
        try:
            lines = "".join(json.dumps(r) + "\n" for r in rows)
        except (TypeError, ValueError):  # images, tensors
            lines = None
        if lines is not None and eval_rows is None:  # the run's own copy: the CLI repeats, evaluates and resumes it
            path = run_dir / "train_dataset.jsonl"
            if not path.exists():
                path.write_text(lines)
            changes["task"] = str(path)
        return Config(**{**dataclasses.asdict(cfg), **_rewards_follow_task(cfg, changes)}), task

    @property
    def run_dir(self) -> Path:
        return self.trainer.run_dir

    def train(self, resume_from_checkpoint: str | bool | None = None) -> dict:
        """Train (as ``grpo train``); the result holds the held-out accuracy before and after."""
        if resume_from_checkpoint:
            raise ConfigError("resume_from_checkpoint: set it in GRPOConfig(...) (a run folder or 'auto'), so the "
                              "trainer restores the run before it starts")
        return self.trainer.train()

    def evaluate(self) -> dict:
        """Greedy accuracy and pass@k of the current policy on the held-out prompts."""
        try:
            return self.trainer.evaluate()
        finally:
            self.trainer.close()

    def save_model(self, output_dir: str | None = None) -> Path:
        """The newest checkpoint as a plain transformers folder (LoRA merged), as ``grpo export``; into
        the run folder's ``final/`` when ``output_dir`` is the run folder itself (TRL scripts pass
        ``args.output_dir``) or not given."""
        from grpo.serve.models import export

        out = Path(output_dir) if output_dir else self.run_dir / "final"
        if out.resolve() == Path(self.run_dir).resolve():
            out = Path(self.run_dir) / "final"
        return export(str(self.run_dir), out)




class AsyncGRPOTrainer(GRPOTrainer):
    """TRL's ``AsyncGRPOTrainer`` name (trl.experimental.async_grpo): ``GRPOTrainer`` over a config with
    asynchronous rollouts, ``AsyncGRPOConfig(...)`` by default (a ``GRPOConfig``/``Config`` given without them
    gets async_rollouts=True). TRL's ``rollout_worker`` and ``weight_transfer`` hooks have no grpo
    counterpart: grpo's producer and weight publishing are its own (docs/guides/async.md)."""

    def __init__(self, model: str | None = None, reward_funcs=None, args: Config | None = None, train_dataset=None,
                 processing_class=None, callbacks=None, optimizers=(None, None), peft_config=None, tools=None,
                 environment_factory=None, rollout_worker=None, weight_transfer=None):
        if rollout_worker is not None or weight_transfer is not None:
            raise ConfigError("rollout_worker, weight_transfer: grpo's producer samples and publishes the weights "
                              "itself (async_rollouts); leave them unset")
        args = AsyncGRPOConfig() if args is None else args
        if not args.async_rollouts:
            args = dataclasses.replace(args, async_rollouts=True)
        super().__init__(model, reward_funcs, args, train_dataset, processing_class=processing_class,
                         callbacks=callbacks, optimizers=optimizers, peft_config=peft_config, tools=tools,
                         environment_factory=environment_factory)
