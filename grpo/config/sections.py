"""The config's fields by topic: each section names the part of grpo that reads its fields.

``SECTIONS`` is the one place a field's section is declared: ``grpo train --help SECTION`` prints one
section, ``grpo train --help`` all of them in this order, and the documentation's configuration page
is generated from it. ``Config``'s fields are written in ``fields.py`` in the same order, section by
section; tests/test_config.py checks that every field is in exactly one section and that the two
orders agree.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Section:
    name: str  # what `grpo train --help NAME` takes
    title: str
    reader: str  # which part of grpo reads these fields
    fields: tuple[str, ...]


SECTIONS: tuple[Section, ...] = (
    Section("model", "Model and data", "model loading (grpo/models), LoRA / QLoRA, the task and its prompts (grpo/data)", (
        "model", "task", "task_split", "prompt_field", "answer_field", "system_prompt", "chat_template_kwargs", "arithmetic_max_operand",
        "arithmetic_ops", "use_peft", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "load_in_4bit")),
    Section("sampling", "Sampling and engines", "the collector and the rollout engines (grpo/rollout, train/collect.py)", (
        "num_generations", "prompts_per_step", "max_prompt_length", "max_completion_length", "temperature", "top_p",
        "top_k", "min_p", "repetition_penalty", "generation_kwargs", "rollout_engine", "decode_kernels", "vllm_gpu_memory_utilization", "vllm_enable_sleep_mode",
        "vllm_enforce_eager", "vllm_server_host", "vllm_server_port", "vllm_server_urls", "vllm_server_timeout",
        "vllm_server_request_timeout", "vllm_server_weight_dir", "rollout_correction", "rollout_correction_level",
        "rollout_correction_low", "rollout_correction_high", "resample_invalid_rounds")),
    Section("async", "Asynchronous rollouts", "the producer, its engine process and the staleness bound (train/async_rollouts.py, rollout/producer.py, core/staleness.py)", (
        "async_rollouts", "max_staleness", "partial_rollouts", "partial_rollout_tokens", "async_correction",
        "async_engine_threads", "async_turns")),
    Section("mixture", "Mixtures and curriculum",
            "the prompt stream: a mixture's sources and the difficulty sampler (data/mixture.py, train/sources.py)", (
        "difficulty_sampling", "difficulty_memory", "difficulty_floor")),
    Section("rewards", "Rewards", "the reward runner (grpo/rewards): which rewards score a completion, and how they run", (
        "rewards", "reward_weights", "reward_timeout", "reward_workers", "max_reward_failure_share", "reward_retries",
        "reward_concurrency", "reward_model", "reward_model_transform", "supervision", "step_reward")),
    Section("loss", "Advantages and loss", "advantages and the policy loss (grpo/core: advantages, policy_losses, token_masks)", (
        "recipe", "advantage_estimator", "scale_rewards_unbiased", "std_eps", "multi_objective_aggregation", "token_weight_gamma",
        "policy_loss", "epsilon", "epsilon_high", "dual_clip", "clip_delta", "importance_sampling_level", "aggregation",
        "entropy_coef", "cispo_ratio_max", "sapo_temperature_pos", "sapo_temperature_neg", "vespo_k_pos", "vespo_lambda_pos",
        "vespo_k_neg", "vespo_lambda_neg", "top_entropy_quantile",
        "off_policy_mask_threshold", "cov_mode", "cov_fraction", "kl_cov_coef")),
    Section("logic_consistency", "Logic-consistency regulariser", "the regulariser on sampled completions (train/logic_consistency.py, core/logic_consistency.py)", (
        "logic_consistency", "logic_consistency_coef", "logic_consistency_model")),
    Section("kl", "KL and reference", "the KL term and the reference policy", (
        "beta", "kl_estimator", "ref_reset_steps")),
    Section("filters", "Filters", "which groups, completions and tokens a step trains on (core/stability.py)", (
        "dynamic_sampling", "dynamic_sampling_rounds", "overlong_filter", "overlong_buffer", "overlong_penalty_coef",
        "policy_filter", "policy_filter_min_std")),
    Section("controllers", "Controllers and fuse", "the knobs moved between steps and the fuse (train/knobs.py)", (
        "entropy_target_band", "entropy_target_knob", "clip_target_band", "clip_epsilon_min", "clip_epsilon_max",
        "controller_factor", "kl_target", "kl_adapt_rate", "clip_step_band", "clip_step_size", "clip_step_patience",
        "fuse_metric", "fuse_min", "fuse_max", "fuse_patience")),
    Section("monitors", "Monitors", "the consistency probe and the logged health metrics (eval/probe.py, core/metrics.py)", (
        "monitor_preset", "consistency_steps", "consistency_prompts", "consistency_random", "consistency_group_size",
        "consistency_converging", "consistency_guessing", "consistency_plateau", "correct_threshold")),
    Section("optimisation", "Optimisation and batching", "the updater: optimizer, schedule, passes, micro-batches (train/update.py)", (
        "max_steps", "num_train_epochs", "lr_preset", "learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay", "adam_beta1", "adam_beta2",
        "max_grad_norm", "num_iterations", "mini_batches", "per_device_train_batch_size", "max_tokens_per_forward",
        "shared_prefix", "gradient_checkpointing", "skip_zero_advantage", "max_consecutive_skips", "torch_compile")),
    Section("critic", "Critic (PPO)", "the value model of advantage_estimator=gae (train/critic.py)", (
        "gamma", "lam", "critic_learning_rate", "cliprange_value", "critic_shared_trunk", "vf_coef",
        "critic_divergence_factor")),
    Section("reward_model_training", "Reward-model training", "the reward model that keeps learning (train/reward_model.py)", (
        "reward_model_train_steps", "reward_model_verifier", "reward_model_objective", "reward_model_replay",
        "reward_model_buffer_size", "reward_model_batch_size", "reward_model_lr", "reward_model_heldout",
        "reward_model_teacher", "reward_model_distill_temperature", "reward_model_warmup_draws",
        "prm_label_solutions", "prm_label_continuations", "prm_label")),
    Section("agent", "Agent: tools and environments", "multi-turn episodes (grpo/agent)", (
        "tools", "environment_factory", "environment_column", "agent", "agent_timeout", "max_turns", "tool_format", "tool_example_call",
        "tool_example_question", "tool_timeout")),
    Section("distill", "Distillation", "on-policy distillation: the teacher as the reference (models/teacher.py), policy_loss=distill (core/distill.py)", (
        "teacher", "distill_grpo_weight")),
    Section("judge", "Judge reward", "rewards=judge: a chat model behind an OpenAI-compatible API scores completions (rewards/judge.py)", (
        "judge_url", "judge_model", "judge_api_key_env", "judge_template", "judge_score", "judge_score_scale",
        "judge_mode", "judge_max_tokens", "judge_temperature")),
    Section("sft", "Supervised fine-tuning", "`grpo sft`: chat or prompt/completion rows, the loss on the assistant's tokens (grpo/sft)", (
        "sft_data", "sft_epochs", "sft_batch_size", "sft_max_length", "sft_packing", "sft_eval_share")),
    Section("evaluation", "Evaluation", "held-out accuracy and pass@k before, during and after training (grpo/eval)", (
        "eval_prompts", "eval_steps", "eval_max_new_tokens", "eval_batch_size", "eval_pass_k", "eval_pass_prompts",
        "eval_tasks", "best_checkpoint_metric", "best_checkpoint_mode")),
    Section("run", "Run and logging", "the run folder, checkpoints and logs (infra/checkpoint.py, infra/logger.py)", (
        "output_dir", "working_dir", "seed", "save_steps", "save_total_limit", "resume_from_checkpoint",
        "logging_steps", "log_completions_steps", "report_to", "progress")),
    Section("hardware", "Hardware and distributed", "precision, threads, memory and torchrun (models/precision.py, infra)", (
        "dtype", "bf16", "distributed_strategy", "num_threads", "reuse_freed_memory")),
    Section("cluster", "Cluster (Ray)", "launcher=ray: trainer ranks, rollout and reward workers on a Ray cluster (grpo/cluster)", (
        "launcher", "ray_address", "ray_trainers", "ray_rollout_workers", "ray_reward_workers", "ray_trainer_cpus",
        "ray_rollout_cpus", "ray_reward_cpus", "ray_trainer_gpus", "ray_rollout_gpus", "ray_max_restarts",
        "ray_call_timeout", "ray_start_timeout")),
)

SECTION_OF: dict[str, str] = {f: s.name for s in SECTIONS for f in s.fields}


def section(name: str) -> Section:
    """The section called ``name``; an unknown name lists the valid ones."""
    for s in SECTIONS:
        if s.name == name:
            return s
    raise KeyError(f"no config section {name!r}; sections: {', '.join(s.name for s in SECTIONS)}")


def field_order() -> list[str]:
    """Every field, section by section: the order of ``Config``'s fields in fields.py."""
    return [f for s in SECTIONS for f in s.fields]
