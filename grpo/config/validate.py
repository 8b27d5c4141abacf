"""The rules a Config must satisfy, each failing with a ConfigError that names the field. Valid
choices are read from the registries of the layers below (estimators and policy losses in grpo.core,
rollout engines, kernel products), so a new registry entry needs no change here."""

from __future__ import annotations

import importlib.util
import os

from grpo.config.validate_sft import validate_beside_grpo
from grpo.core import (AGGREGATIONS, COV_MODES, ESTIMATORS, KL_ESTIMATORS,
                       MULTI_OBJECTIVE_AGGREGATIONS, PF_MODES, POLICY_LOSSES, RATIO_LEVELS)
from grpo.core.stability import REWARD_TRANSFORMS
from grpo.core.rollout_correction import CORRECTION_LEVELS, CORRECTION_MODES
from grpo.config.composition import PEFT_RESET, refused
from grpo.data.mixture import parse_mixture
from grpo.errors import ConfigError
from grpo.rollout import ROLLOUT_ENGINES
from grpo.rollout.tuning import parse_override

SCHEDULES = ("constant", "cosine", "linear")
DTYPES = ("float32", "bfloat16", "float16")


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


def _validate_report_to(value: str) -> None:
    """Each tracker report_to names is one grpo has, and its package is installed."""
    from grpo.infra.trackers import TRACKERS, missing_package, tracker_names

    names = tracker_names(value)
    unknown = [n for n in names if n not in TRACKERS]
    if unknown or len(set(names)) < len(names):
        raise ConfigError(f"report_to: {value!r} is not valid; a comma list of {', '.join(TRACKERS)} (each once), "
                          "all (every one installed) or none")
    for name in names:
        if reason := missing_package(name):
            raise ConfigError(f"{reason}; or leave {name} out of report_to")


def validate(c) -> None:
    """Every rule a Config must satisfy; a ConfigError names the field. Choices come from the
    registries (estimators, policy losses, rollout engines, ...), so a new entry is valid at once."""
    _validate_choices(c)
    _validate_values(c)
    _validate_stability(c)
    _validate_loss_variants(c)
    _validate_monitors(c)
    _validate_reward_training(c)
    _validate_vllm(c)
    _validate_agent(c)
    _validate_async(c)
    _validate_cluster(c)
    _validate_consistency(c)
    validate_beside_grpo(c)  # teacher, judge, sft (validate_sft.py)
    _refuse_composition(c, processes=1)


def _refuse_composition(c, *, processes: int) -> None:
    """A pair of features the composition table (config/composition.py) refuses, naming its field."""
    r = refused(c, processes)
    if r is not None:
        raise ConfigError(f"{r.field}: {r.reason}")


def _validate_choices(c) -> None:
    _choice("advantage_estimator", c.advantage_estimator, list(ESTIMATORS))
    _choice("policy_loss", c.policy_loss, POLICY_LOSSES)
    _choice("aggregation", c.aggregation, AGGREGATIONS)
    _choice("kl_estimator", c.kl_estimator, KL_ESTIMATORS)
    _choice("importance_sampling_level", c.importance_sampling_level, RATIO_LEVELS)
    _choice("lr_scheduler_type", c.lr_scheduler_type, SCHEDULES)
    _choice("dtype", c.dtype, DTYPES)
    _validate_report_to(c.report_to)
    _choice("distributed_strategy", c.distributed_strategy, ("ddp", "fsdp2"))
    _choice("rollout_engine", c.rollout_engine, ROLLOUT_ENGINES)
    reason = ROLLOUT_ENGINES[c.rollout_engine].unavailable_reason()
    if reason is not None:
        raise ConfigError(f"rollout_engine: {c.rollout_engine} {reason}")
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
    non_negative = ["vf_coef", "reward_timeout", "max_steps", "warmup_steps", "save_steps", "ref_reset_steps", "beta",
                    "learning_rate", "weight_decay", "max_grad_norm", "eval_pass_k", "eval_pass_prompts",
                    "log_completions_steps", "num_threads", "max_tokens_per_forward", "save_total_limit", "max_consecutive_skips", "top_k", "std_eps", "entropy_coef",
                    "arithmetic_max_operand", "lora_dropout", "eval_steps", "reward_retries"]
    for key in non_negative:
        if getattr(c, key) < 0:
            raise ConfigError(f"{key}: must be >= 0, got {getattr(c, key)}")
    if c.max_reward_failure_share <= 0:
        raise ConfigError(f"max_reward_failure_share: must be > 0 (1.0: stop when no completion of a step could be "
                          f"scored; above 1: never), got {c.max_reward_failure_share}")
    if c.eval_prompts is not None and c.eval_prompts < 0:
        raise ConfigError(f"eval_prompts: must be >= 0 (or null: chosen by the dataset's size), got {c.eval_prompts}")
    if c.num_train_epochs is not None and c.num_train_epochs <= 0:
        raise ConfigError(f"num_train_epochs: must be > 0 (or null: max_steps decides), got {c.num_train_epochs}")
    if c.temperature <= 0:
        raise ConfigError(f"temperature: must be > 0, got {c.temperature}")
    _validate_sampling(c)
    if not 0 <= c.epsilon < 1 or c.eps_high < 0:
        raise ConfigError(f"epsilon/epsilon_high: need 0 <= epsilon < 1 and epsilon_high >= 0, "
                          f"got {c.epsilon}, {c.epsilon_high}")
    if c.dual_clip is not None and c.dual_clip <= 1:
        raise ConfigError(f"dual_clip: must be > 1 (or null), got {c.dual_clip}")
    if c.num_generations < 2 and ESTIMATORS[c.advantage_estimator].group:
        raise ConfigError(f"num_generations: {c.advantage_estimator!r} compares completions within a group "
                          f"and needs num_generations >= 2, got {c.num_generations}")
    _validate_batch_arithmetic(c)
    if not c.reward_names and parse_mixture(c.task) is None:  # a mixture's sources bring their own
        raise ConfigError("rewards: name at least one reward function")
    if c.reward_weights is not None and len(c.reward_weights) != len(c.reward_names):
        raise ConfigError(f"reward_weights: {len(c.reward_weights)} weights for {len(c.reward_names)} rewards "
                          f"({c.reward_names})")
    if not set(c.arithmetic_ops) <= set("+-*") or not c.arithmetic_ops:
        raise ConfigError(f"arithmetic_ops: use characters from '+-*', got {c.arithmetic_ops!r}")
    if ESTIMATORS[c.advantage_estimator].critic and c.use_peft:
        raise ConfigError("advantage_estimator: gae trains a full value model; it is not combined with use_peft")
    if not (0 <= c.gamma <= 1 and 0 <= c.lam <= 1):
        raise ConfigError(f"gamma/lam: must lie in [0, 1], got {c.gamma}, {c.lam}")
    if "reward_model" in c.reward_names and not c.reward_model:
        raise ConfigError("reward_model: the reward_model reward needs reward_model=<folder or hub id>")
    _choice("supervision", c.supervision, ("outcome", "process"))
    if c.supervision == "process" and ESTIMATORS[c.advantage_estimator].critic:
        raise ConfigError("supervision: process supervision uses group-normalized step rewards, not gae")
    if c.eval_steps and c.eval_prompts == 0:
        raise ConfigError("eval_steps: evaluation during training needs held-out prompts (eval_prompts > 0)")
    if c.load_in_4bit and not c.use_peft:
        raise ConfigError("load_in_4bit: a 4-bit base cannot be trained itself; set use_peft=true (QLoRA)")
    if c.load_in_4bit and c.rollout_engine not in ("auto", "hf"):
        raise ConfigError(f"load_in_4bit: rollout_engine {c.rollout_engine} does not sample a 4-bit model; "
                          "use rollout_engine=auto or hf")
    if c.use_peft and c.ref_reset_steps:
        raise ConfigError(f"ref_reset_steps: {PEFT_RESET}")


def _validate_batch_arithmetic(c) -> None:
    """Where one value fits it is derived (fields.py); where several do, the error lists them."""
    n = c.sequences_per_step
    if n % c.per_device_train_batch_size:
        raise ConfigError(f"per_device_train_batch_size: prompts_per_step * num_generations = {n} is not a "
                          f"multiple of {c.per_device_train_batch_size}; use one of {divisors(n)} (unset: "
                          f"{derived_micro_batch(c.prompts_per_step, c.num_generations)})")
    if c.prompts_per_step % c.mini_batches:
        from grpo.config.presets import RECIPES

        why = f" (recipe={c.recipe} sets it)" if "mini_batches" in RECIPES.get(c.recipe, {}) else ""
        raise ConfigError(f"mini_batches: {c.prompts_per_step} prompts per step cannot be split into "
                          f"{c.mini_batches} mini-batches{why} of whole groups; use one of {divisors(c.prompts_per_step)}, "
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
    if c.fuse_metric and c.fuse_min is None and c.fuse_max is None:
        raise ConfigError("fuse_metric: set fuse_min and/or fuse_max, the band the metric must stay in")
    if c.fuse_metric.startswith("consistency_") and not c.consistency_steps:
        raise ConfigError(f"fuse_metric: {c.fuse_metric} is logged only with consistency_steps > 0")


# loss variants
CLIP_ONLY = ("dual_clip", "clip_delta", "cov_mode")  # terms of the clip loss, which the other losses do not have


def _validate_loss_variants(c) -> None:
    _choice("multi_objective_aggregation", c.multi_objective_aggregation, MULTI_OBJECTIVE_AGGREGATIONS)
    if c.multi_objective_aggregation == "normalize_then_sum" and (c.advantage_estimator != "grpo"
                                                                   or c.supervision != "outcome"):
        raise ConfigError("multi_objective_aggregation: normalize_then_sum (GDPO) is its own group normalisation; "
                          f"it needs advantage_estimator=grpo and supervision=outcome, got "
                          f"{c.advantage_estimator!r}, {c.supervision!r}")
    if c.multi_objective_aggregation == "normalize_then_sum" and c.overlong_buffer:
        raise ConfigError("overlong_buffer: the soft overlong penalty is added to the summed reward, which "
                          "normalize_then_sum (GDPO) does not use; add a length reward to `rewards` instead")
    if c.policy_loss != "clip":
        for key in CLIP_ONLY:
            if getattr(c, key) is not None:
                raise ConfigError(f"{key}: a term of policy_loss=clip; {c.policy_loss!r} has none (set it to null)")
        if c.clip_target_band is not None and c.policy_loss in ("cispo", "sapo"):
            raise ConfigError(f"clip_target_band: moves epsilon, which policy_loss={c.policy_loss!r} does not read")
    if c.policy_loss == "gmpo" and c.importance_sampling_level != "token":
        raise ConfigError("importance_sampling_level: gmpo's ratio is already per sequence (a geometric mean of "
                          "the token ratios); leave it at token")
    if c.clip_delta is not None and c.clip_delta <= 1 + c.eps_high:
        raise ConfigError(f"clip_delta: must be > 1 + epsilon_high = {1 + c.eps_high} (or null), got {c.clip_delta}")
    if c.cispo_ratio_max <= 0:
        raise ConfigError(f"cispo_ratio_max: must be > 0, got {c.cispo_ratio_max}")
    for key in ("vespo_lambda_pos", "vespo_lambda_neg"):
        if getattr(c, key) <= 0:
            raise ConfigError(f"{key}: must be > 0 (the Gamma weight's rate), got {getattr(c, key)}")
    for key in ("sapo_temperature_pos", "sapo_temperature_neg"):
        if getattr(c, key) <= 0:
            raise ConfigError(f"{key}: must be > 0, got {getattr(c, key)}")
    if not 0 < c.top_entropy_quantile <= 1:
        raise ConfigError(f"top_entropy_quantile: must lie in (0, 1], got {c.top_entropy_quantile}")
    if c.off_policy_mask_threshold is not None:
        if c.off_policy_mask_threshold < 0:
            raise ConfigError(f"off_policy_mask_threshold: must be >= 0 (or null), got {c.off_policy_mask_threshold}")
        if c.num_iterations == 1 and c.mini_batches == 1:
            raise ConfigError("off_policy_mask_threshold: with one optimizer step per batch the policy is the "
                              "sampling policy (KL 0), so nothing is masked; use num_iterations > 1 or mini_batches > 1")


def _validate_monitors(c) -> None:
    """Seed monitors (additive clip control, the consistency probe's states, reward-model
    transforms)."""
    _choice("reward_model_transform", c.reward_model_transform, REWARD_TRANSFORMS)
    if c.reward_model_transform != "none" and "reward_model" not in c.reward_names:
        raise ConfigError(f"reward_model_transform: {c.reward_model_transform} maps the reward_model reward's scores, "
                          f"which this run does not use (rewards={c.rewards!r})")
    band = c.clip_step_band
    if band is not None:
        if len(band) != 2 or not 0 <= band[0] < band[1] <= 1:
            raise ConfigError(f"clip_step_band: need [low, high] with 0 <= low < high <= 1, got {band}")
        if c.clip_target_band is not None:
            raise ConfigError("clip_step_band: clip_target_band also moves epsilon; set one of them")
        if c.num_iterations == 1 and c.mini_batches == 1:
            raise ConfigError("clip_step_band: needs num_iterations > 1 or mini_batches > 1 (with one optimizer "
                              "step per batch nothing is ever clipped)" + (" (set by monitor_preset="
                              f"{c.monitor_preset})" if c.monitor_preset != "none" else ""))
        if c.clip_step_size <= 0 or c.clip_step_patience < 1:
            raise ConfigError(f"clip_step_size / clip_step_patience: need > 0 and >= 1, got {c.clip_step_size}, "
                              f"{c.clip_step_patience}")
    if c.consistency_group_size < 0 or c.consistency_group_size == 1:
        raise ConfigError(f"consistency_group_size: need 0 (num_generations) or >= 2, got {c.consistency_group_size}")
    if not c.consistency_converging <= c.consistency_plateau <= c.consistency_guessing:
        raise ConfigError("consistency_converging / consistency_plateau / consistency_guessing: need converging <= "
                          f"plateau <= guessing, got {c.consistency_converging}, {c.consistency_plateau}, "
                          f"{c.consistency_guessing}")


def _validate_reward_training(c) -> None:
    """Reward model training / code rewards."""
    if c.resample_invalid_rounds < 0:
        raise ConfigError(f"resample_invalid_rounds: must be >= 0, got {c.resample_invalid_rounds}")
    if c.token_weight_gamma <= 0:
        raise ConfigError(f"token_weight_gamma: must be > 0 (1.0 = off), got {c.token_weight_gamma}")
    if c.reward_model_train_steps:
        if c.reward_model_train_steps < 0:
            raise ConfigError(f"reward_model_train_steps: must be >= 0, got {c.reward_model_train_steps}")
        prm = trains_prm(c)
        if not c.reward_model and not prm:
            raise ConfigError("reward_model_train_steps: set reward_model to the sequence-classification model to train, "
                              "or supervision=process with step_reward=prm:<folder> (a process reward model)")
        if prm:
            _validate_prm_training(c)
        if not c.ref_reset_steps:
            raise ConfigError("reward_model_train_steps: the reward model trains at iteration boundaries; set "
                              "ref_reset_steps (the steps per iteration)")
        _choice("reward_model_objective", c.reward_model_objective, ("pointwise", "pairwise"))
        if not 0 <= c.reward_model_replay < 1:
            raise ConfigError(f"reward_model_replay: must be in [0, 1), got {c.reward_model_replay}")
        for key in ("reward_model_buffer_size", "reward_model_batch_size"):
            if getattr(c, key) < 1:
                raise ConfigError(f"{key}: must be >= 1, got {getattr(c, key)}")
        if c.reward_model_lr <= 0 or c.reward_model_distill_temperature <= 0 or c.reward_model_heldout < 0:
            raise ConfigError("reward_model_lr and reward_model_distill_temperature must be > 0, "
                              "reward_model_heldout >= 0")
        _validate_reward_model_warmup(c)
    elif c.reward_model_warmup_draws:
        raise ConfigError("reward_model_warmup_draws: the warm-up trains the reward model; set "
                          "reward_model_train_steps (its optimizer steps)")


def trains_prm(c) -> bool:
    """Whether reward_model_train_steps trains a process reward model (step_reward=prm:<folder>)."""
    from grpo.rewards.prm import PREFIX

    return bool(c.reward_model_train_steps) and c.supervision == "process" and c.step_reward.startswith(PREFIX)


def _validate_prm_training(c) -> None:
    _choice("prm_label", c.prm_label, ("soft", "hard"))
    for key in ("prm_label_solutions", "prm_label_continuations"):
        if getattr(c, key) < 1:
            raise ConfigError(f"{key}: must be >= 1, got {getattr(c, key)}")
    if not c.reward_model:  # these shape the sequence classifier's training only
        for key in ("reward_model_objective", "reward_model_teacher"):
            if getattr(c, key) != getattr(type(c), key):
                raise ConfigError(f"{key}: trains the sequence-classification reward_model; the process reward "
                                  "model learns its step labels by cross-entropy (prm_label)")
    if c.async_rollouts:
        raise ConfigError("reward_model_train_steps with step_reward=prm: labels steps with the policy's own engine at "
                          "iteration boundaries; async_rollouts samples from it beside the trainer: set one")


def _validate_reward_model_warmup(c) -> None:
    if c.reward_model_warmup_draws < 0:
        raise ConfigError(f"reward_model_warmup_draws: must be >= 0, got {c.reward_model_warmup_draws}")
    if c.reward_model_warmup_draws and not c.reward_model:
        raise ConfigError("reward_model_warmup_draws: the warm-up trains the reward_model (a sequence classifier); "
                          "set reward_model")
    groups = c.reward_model_warmup_draws * c.prompts_per_step
    if c.reward_model_warmup_draws and groups <= c.reward_model_heldout:
        raise ConfigError(f"reward_model_warmup_draws: {c.reward_model_warmup_draws} draw(s) of prompts_per_step="
                          f"{c.prompts_per_step} give {groups} groups, all taken by the held-out set "
                          f"(reward_model_heldout={c.reward_model_heldout}): the warm-up would train on nothing; "
                          f"use more than {c.reward_model_heldout // c.prompts_per_step} draws")


def _validate_vllm(c) -> None:
    """vLLM's settings and the train/inference mismatch correction."""
    _choice("rollout_correction", c.rollout_correction, ("auto", "none", *CORRECTION_MODES))
    _choice("rollout_correction_level", c.rollout_correction_level, CORRECTION_LEVELS)
    low, high = c.rollout_correction_low, c.rollout_correction_high
    if (low is not None and low < 0) or (high is not None and high <= 0) or (None not in (low, high) and low > high):
        raise ConfigError(f"rollout_correction_low/high: need 0 <= low <= high and high > 0, got {low}, {high}")
    if not 0 < c.vllm_gpu_memory_utilization <= 1:
        raise ConfigError(f"vllm_gpu_memory_utilization: must lie in (0, 1], got {c.vllm_gpu_memory_utilization}")
    if not 0 < c.vllm_server_port < 65536 or c.vllm_server_timeout < 0:
        raise ConfigError(f"vllm_server_port must lie in 1..65535 and vllm_server_timeout be >= 0, got "
                          f"{c.vllm_server_port}, {c.vllm_server_timeout}")
    if c.vllm_server_urls:
        from grpo.rollout.vllm.client import VLLMServerOptions, server_urls

        try:
            server_urls(VLLMServerOptions(urls=c.vllm_server_urls))
        except ValueError as e:
            raise ConfigError(str(e)) from None
    if c.vllm_server_request_timeout <= 0:
        raise ConfigError(f"vllm_server_request_timeout: must be > 0, got {c.vllm_server_request_timeout}")
    if c.vllm_server_weight_dir is not None and not os.path.isdir(c.vllm_server_weight_dir):
        raise ConfigError(f"vllm_server_weight_dir: {c.vllm_server_weight_dir!r} is not a folder")


def _validate_cluster(c) -> None:
    """launcher=ray's counts and resources, and what it does not place (checked before Ray starts)."""
    _choice("launcher", c.launcher, ("local", "ray"))
    for name, low in (("ray_trainers", 1), ("ray_rollout_workers", 1), ("ray_reward_workers", 0), ("ray_max_restarts", 0)):
        if getattr(c, name) < low:
            raise ConfigError(f"{name}: must be >= {low}, got {getattr(c, name)}")
    for name in ("ray_trainer_cpus", "ray_rollout_cpus", "ray_reward_cpus", "ray_start_timeout", "ray_call_timeout"):
        if not getattr(c, name) > 0:
            raise ConfigError(f"{name}: must be > 0, got {getattr(c, name)}")
    for name in ("ray_trainer_gpus", "ray_rollout_gpus"):
        if getattr(c, name) < 0:
            raise ConfigError(f"{name}: must be >= 0, got {getattr(c, name)}")
    if c.launcher != "ray":
        return
    if c.ray_trainer_gpus != int(c.ray_trainer_gpus):
        raise ConfigError(f"ray_trainer_gpus: 0 or a whole number of GPUs per trainer rank, got {c.ray_trainer_gpus} "
                          "(a rank trains on one device; ranks sharing a GPU cannot join one NCCL group)")
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise ConfigError("launcher: ray is not installed here; pip install 'grpo[ray]' (or launcher=local)")
    if c.prompts_per_step % c.ray_trainers:
        raise ConfigError(f"ray_trainers: prompts_per_step ({c.prompts_per_step}) must divide evenly over "
                          f"{c.ray_trainers} trainer ranks")
    if c.rollout_engine == "vllm_server":
        raise ConfigError("rollout_engine: launcher=ray places its own rollout workers (rollout_engine fast, hf or "
                          "vllm, ray_rollout_workers of them); vllm_server is for servers started apart")
    if c.async_rollouts and c.partial_rollouts:
        raise ConfigError("partial_rollouts: not available with launcher=ray (a rollout worker takes new weights "
                          "between sampling calls, not within one); set partial_rollouts=false or launcher=local")


def _validate_consistency(c) -> None:
    """The logic-consistency regulariser, checked before anything loads (its embedding model loads late)."""
    if c.logic_consistency_coef < 0:
        raise ConfigError(f"logic_consistency_coef: must be >= 0, got {c.logic_consistency_coef}")
    if not c.logic_consistency:
        return
    if c.num_generations < 2:
        raise ConfigError("logic_consistency: needs num_generations >= 2 (a leave-one-out baseline)")
    if importlib.util.find_spec("sentence_transformers") is None:
        raise ConfigError("logic_consistency: needs sentence-transformers (pip install -e '.[consistency]')")


def _validate_sampling(c) -> None:
    """The sampling distribution's settings (grpo.core.sampling) and what an engine cannot match."""
    if not 0 < c.top_p <= 1:
        raise ConfigError(f"top_p: must be in (0, 1], got {c.top_p}")
    if not 0 <= c.min_p < 1:
        raise ConfigError(f"min_p: must be in [0, 1), got {c.min_p}")
    if not c.repetition_penalty > 0:
        raise ConfigError(f"repetition_penalty: must be > 0 (1.0 = off), got {c.repetition_penalty}")
    if c.min_p > 0 and c.top_p < 1 and c.rollout_engine in ("vllm", "vllm_server"):
        raise ConfigError("min_p: with top_p < 1 on rollout_engine=vllm the kept tokens differ from the trainer's "
                          "(vLLM applies min_p before top_p, transformers after), so the corrections would compare "
                          "two distributions; set one of min_p and top_p")


def _validate_agent(c) -> None:
    """The tool settings (the tools and the environment are resolved when the run starts)."""
    from grpo.agent.formats import CALL_FORMATS

    _choice("tool_format", c.tool_format, ["auto", *CALL_FORMATS])
    if c.max_turns < 1:
        raise ConfigError(f"max_turns: must be >= 1, got {c.max_turns}")
    if c.tool_timeout < 0:
        raise ConfigError(f"tool_timeout: must be >= 0 (0 = no deadline), got {c.tool_timeout}")
    if c.agent.strip() and (c.tools.strip() or c.environment_factory.strip()):
        raise ConfigError("agent: an agent program runs its own tools; it does not run with tools or "
                          "environment_factory (set those to '')")
    if c.agent_timeout <= 0:
        raise ConfigError(f"agent_timeout: must be > 0 seconds, got {c.agent_timeout}")
    if (c.tools.strip() or c.environment_factory.strip() or c.agent.strip()) and c.resample_invalid_rounds:
        raise ConfigError("resample_invalid_rounds: not supported with tools / environment_factory (an episode "
                          "cannot be resampled row by row); set it to 0")


def _validate_async(c) -> None:
    """Asynchronous rollouts: the bound, the correction, and what they do not run with."""
    _choice("async_correction", c.async_correction, CORRECTION_MODES)
    if c.max_staleness < 0 or c.partial_rollout_tokens < 1 or c.async_engine_threads < 0:
        raise ConfigError(f"max_staleness and async_engine_threads must be >= 0 and partial_rollout_tokens >= 1, got "
                          f"{c.max_staleness}, {c.async_engine_threads}, {c.partial_rollout_tokens}")
    # which features it runs with: the composition table (config/composition.py)


def validate_world(c, processes: int) -> None:
    """What cannot run on this many processes, refused before anything loads."""
    if c.prompts_per_step % processes:
        lower = c.prompts_per_step - c.prompts_per_step % processes
        near = [v for v in (lower, lower + processes) if v > 0]
        raise ConfigError(f"prompts_per_step: {c.prompts_per_step} prompts cannot be split evenly over "
                          f"{processes} processes (each group stays on one process); use a multiple of "
                          f"{processes}, e.g. {' or '.join(map(str, near))}")
    if (c.prompts_per_step // processes) % c.mini_batches:
        b = c.prompts_per_step // processes
        raise ConfigError(f"mini_batches: each process's {b} prompts cannot be split into {c.mini_batches} "
                          f"mini-batches of whole groups; use one of {divisors(b)}")
    if processes == 1:
        return
    _refuse_composition(c, processes=processes)
