"""The rules a Config must satisfy, each failing with a ConfigError that names the field. Valid
choices are read from the registries of the layers below (estimators and policy losses in grpo.core,
rollout engines, kernel products), so a new registry entry needs no change here."""

from __future__ import annotations

import importlib.util

from grpo.core import (AGGREGATIONS, COV_MODES, ESTIMATORS, GROUP_ESTIMATORS, KL_ESTIMATORS, PF_MODES,
                       POLICY_LOSSES, RATIO_LEVELS)
from grpo.errors import ConfigError
from grpo.rollout import ROLLOUT_ENGINES
from grpo.rollout.tuning import parse_override

SCHEDULES = ("constant", "cosine", "linear")
DTYPES = ("float32", "bfloat16", "float16")
REPORT_TO = ("tensorboard", "wandb", "none")


MICRO_BATCH_CAP = 8  # the derived micro-batch: the largest divisor of B * G up to this


def divisors(n: int) -> list[int]:
    """The divisors of n in increasing order (none for n < 1)."""
    return [d for d in range(1, n + 1) if n % d == 0]


def derived_micro_batch(prompts_per_step: int, num_generations: int) -> int:
    """The largest divisor of B * G up to MICRO_BATCH_CAP (1 where B * G < 1, which validation refuses)."""
    return max([d for d in divisors(prompts_per_step * num_generations) if d <= MICRO_BATCH_CAP], default=1)


def _choice(key: str, value: str, valid) -> None:
    if value not in valid:
        raise ConfigError(f"{key}: {value!r} is not valid; choose one of {sorted(valid)}")


def validate(c) -> None:
    """Every rule a Config must satisfy; a ConfigError names the field. Choices come from the
    registries (estimators, policy losses, rollout engines, ...), so a new entry is valid at once."""
    _validate_choices(c)
    _validate_values(c)
    _validate_stability(c)


def _validate_choices(c) -> None:
    _choice("advantage_estimator", c.advantage_estimator, [*ESTIMATORS, "gae"])
    _choice("policy_loss", c.policy_loss, POLICY_LOSSES)
    _choice("aggregation", c.aggregation, AGGREGATIONS)
    _choice("kl_estimator", c.kl_estimator, KL_ESTIMATORS)
    _choice("importance_sampling_level", c.importance_sampling_level, RATIO_LEVELS)
    _choice("lr_scheduler_type", c.lr_scheduler_type, SCHEDULES)
    _choice("dtype", c.dtype, DTYPES)
    _choice("report_to", c.report_to, REPORT_TO)
    _choice("distributed_strategy", c.distributed_strategy, ("ddp", "fsdp2"))
    _choice("rollout_backend", c.rollout_backend, ROLLOUT_ENGINES)
    try:
        parse_override(c.decode_kernels)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _validate_values(c) -> None:
    positive = ["reward_workers", "num_generations", "prompts_per_step", "max_prompt_length", "max_completion_length",
                "num_iterations", "per_device_train_batch_size", "eval_max_new_tokens", "eval_batch_size",
                "logging_steps", "lora_r", "mini_batches", "reward_concurrency"]
    for key in positive:
        if getattr(c, key) < 1:
            raise ConfigError(f"{key}: must be >= 1, got {getattr(c, key)}")
    non_negative = ["vf_coef", "reward_timeout", "max_steps", "warmup_steps", "save_steps", "ref_reset_steps", "eval_prompts", "beta",
                    "learning_rate", "weight_decay", "max_grad_norm", "eval_pass_k", "eval_pass_prompts",
                    "log_completions_steps", "num_threads", "max_tokens_per_forward", "save_total_limit", "max_consecutive_skips", "top_k", "std_eps", "entropy_coef",
                    "arithmetic_max_operand", "lora_dropout", "eval_steps", "reward_retries"]
    for key in non_negative:
        if getattr(c, key) < 0:
            raise ConfigError(f"{key}: must be >= 0, got {getattr(c, key)}")
    if c.temperature <= 0:
        raise ConfigError(f"temperature: must be > 0, got {c.temperature}")
    if not 0 < c.top_p <= 1:
        raise ConfigError(f"top_p: must be in (0, 1], got {c.top_p}")
    if not 0 <= c.epsilon < 1 or c.eps_high < 0:
        raise ConfigError(f"epsilon/epsilon_high: need 0 <= epsilon < 1 and epsilon_high >= 0, "
                          f"got {c.epsilon}, {c.epsilon_high}")
    if c.dual_clip is not None and c.dual_clip <= 1:
        raise ConfigError(f"dual_clip: must be > 1 (or null), got {c.dual_clip}")
    if c.num_generations < 2 and c.advantage_estimator in GROUP_ESTIMATORS:
        raise ConfigError(f"num_generations: {c.advantage_estimator!r} compares completions within a group "
                          f"and needs num_generations >= 2, got {c.num_generations}")
    _validate_batch_arithmetic(c)
    if not c.reward_names:
        raise ConfigError("rewards: name at least one reward function")
    if c.reward_weights is not None and len(c.reward_weights) != len(c.reward_names):
        raise ConfigError(f"reward_weights: {len(c.reward_weights)} weights for {len(c.reward_names)} rewards "
                          f"({c.reward_names})")
    if not set(c.arithmetic_ops) <= set("+-*") or not c.arithmetic_ops:
        raise ConfigError(f"arithmetic_ops: use characters from '+-*', got {c.arithmetic_ops!r}")
    if c.advantage_estimator == "gae" and c.use_peft:
        raise ConfigError("advantage_estimator: gae trains a full value model; it is not combined with use_peft")
    if not (0 <= c.gamma <= 1 and 0 <= c.lam <= 1):
        raise ConfigError(f"gamma/lam: must lie in [0, 1], got {c.gamma}, {c.lam}")
    if "reward_model" in c.reward_names and not c.reward_model:
        raise ConfigError("reward_model: the reward_model reward needs reward_model=<folder or hub id>")
    _choice("supervision", c.supervision, ("outcome", "process"))
    if c.supervision == "process" and c.advantage_estimator == "gae":
        raise ConfigError("supervision: process supervision uses group-normalized step rewards, not gae")
    if c.eval_steps and not c.eval_prompts:
        raise ConfigError("eval_steps: evaluation during training needs held-out prompts (eval_prompts > 0)")
    if c.load_in_4bit and not c.use_peft:
        raise ConfigError("load_in_4bit: a 4-bit base cannot be trained itself; set use_peft=true (QLoRA)")
    if c.load_in_4bit and c.rollout_backend not in ("auto", "hf"):
        raise ConfigError(f"load_in_4bit: rollout_backend {c.rollout_backend} does not sample a 4-bit model; "
                          "use rollout_backend=auto or hf")
    if c.use_peft and c.ref_reset_steps:
        raise ConfigError("ref_reset_steps: with use_peft the reference is the frozen base model and cannot "
                          "be reset; use full fine-tuning or ref_reset_steps=0")


def _validate_batch_arithmetic(c) -> None:
    """Where one value fits it is derived (fields.py); where several do, the error lists them."""
    n = c.sequences_per_step
    if n % c.per_device_train_batch_size:
        raise ConfigError(f"per_device_train_batch_size: prompts_per_step * num_generations = {n} is not a "
                          f"multiple of {c.per_device_train_batch_size}; use one of {divisors(n)} (unset: "
                          f"{derived_micro_batch(c.prompts_per_step, c.num_generations)})")
    if c.prompts_per_step % c.mini_batches:
        raise ConfigError(f"mini_batches: {c.prompts_per_step} prompts per step cannot be split into "
                          f"{c.mini_batches} mini-batches of whole groups; use one of {divisors(c.prompts_per_step)}, "
                          f"or prompts_per_step a multiple of {c.mini_batches}")


def _validate_stability(c) -> None:
    for key in ("entropy_target_band", "clip_target_band"):
        band = getattr(c, key)
        if band is not None and (len(band) != 2 or not band[0] < band[1]):
            raise ConfigError(f"{key}: need [low, high] with low < high, got {band}")
    _choice("entropy_target_knob", c.entropy_target_knob, ("temperature", "entropy_coef"))
    if c.cov_mode is not None:
        _choice("cov_mode", c.cov_mode, COV_MODES)
    if c.policy_filter is not None:
        _choice("policy_filter", c.policy_filter, PF_MODES)
    for key in ("dynamic_sampling_rounds", "fuse_patience", "consistency_prompts"):
        if getattr(c, key) < 1:
            raise ConfigError(f"{key}: must be >= 1, got {getattr(c, key)}")
    if not 0 <= c.overlong_buffer <= c.max_completion_length:
        raise ConfigError(f"overlong_buffer: must lie in [0, max_completion_length={c.max_completion_length}], "
                          f"got {c.overlong_buffer}")
    if not 0 <= c.cov_fraction <= 1:
        raise ConfigError(f"cov_fraction: must lie in [0, 1], got {c.cov_fraction}")
    if c.clip_target_band is not None and c.epsilon <= 0:
        raise ConfigError("clip_target_band: adaptive clipping scales epsilon and needs epsilon > 0")
    # with one optimizer step per batch the ratio is exactly 1: nothing is clipped and |logp - old_logp|
    # has no gradient, so these tools would silently do nothing
    one_step = c.num_iterations == 1 and c.mini_batches == 1
    if one_step and c.clip_target_band is not None:
        raise ConfigError("clip_target_band: needs num_iterations > 1 or mini_batches > 1 (with one optimizer "
                          "step per batch nothing is ever clipped)")
    if one_step and c.cov_mode == "kl_cov":
        raise ConfigError("cov_mode: kl_cov penalises |logp - old_logp|, which is 0 with no gradient with one "
                          "optimizer step per batch; use num_iterations > 1, mini_batches > 1 or cov_mode=clip_cov")
    if not 0 < c.clip_epsilon_min <= c.clip_epsilon_max:
        raise ConfigError(f"clip_epsilon_min/max: need 0 < min <= max, got {c.clip_epsilon_min}, {c.clip_epsilon_max}")
    if c.controller_factor <= 1:
        raise ConfigError(f"controller_factor: must be > 1, got {c.controller_factor}")
    if c.kl_target is not None and (c.kl_target <= 0 or c.beta <= 0):
        raise ConfigError(f"kl_target: needs kl_target > 0 and beta > 0 (the starting coefficient), got "
                          f"{c.kl_target}, beta={c.beta}")
    for key in ("consistency_steps", "kl_adapt_rate", "policy_filter_min_std", "overlong_penalty_coef", "kl_cov_coef"):
        if getattr(c, key) < 0:
            raise ConfigError(f"{key}: must be >= 0, got {getattr(c, key)}")
    if c.report_to == "wandb" and importlib.util.find_spec("wandb") is None:
        raise ConfigError("report_to: 'wandb' needs the wandb package, which is not installed "
                          "(pip install wandb), or use report_to=tensorboard")
    if c.fuse_metric and c.fuse_min is None and c.fuse_max is None:
        raise ConfigError("fuse_metric: set fuse_min and/or fuse_max, the band the metric must stay in")
    if c.fuse_metric.startswith("consistency_") and not c.consistency_steps:
        raise ConfigError(f"fuse_metric: {c.fuse_metric} is logged only with consistency_steps > 0")
