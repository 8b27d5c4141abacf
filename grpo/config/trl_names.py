"""TRL's GRPOConfig names read as grpo's: one entry per field of TRL's ``GRPOConfig`` (and of the
``transformers.TrainingArguments`` it extends) and of its experimental ``AsyncGRPOConfig``, plus names
older TRL versions had. Checked against TRL 1.16.0 (tests/fixtures/trl/trl-1.16.0-fields.json, and the
installed TRL).

- ``same``: a grpo field of that name and meaning (grpo's default applies to what is not given);
  some also take TRL's extra value forms (a ratio for ``warmup_steps``, true for ``resume_from_checkpoint``).
- ``mapped``: turned into grpo's fields, under whose names the run's config.yaml records it.
- ``refused``: grpo does something else, or nothing like it: an error naming grpo's equivalent, unless
  the value asks for what grpo does anyway (``accepts``).
- ``ignored``: settings of TRL's and transformers' machinery (the hub, data loaders, logging
  integrations) that do not change what grpo trains: accepted, and named in one warning.

``translate`` applies them to the keys a YAML file, key=value arguments or the Python API's
``GRPOConfig(...)`` gave; ``tests/test_trl_names.py`` checks that every field of the installed TRL's
GRPOConfig has an entry; ``python -m grpo.docs`` writes the table ``markdown_table`` generates into
docs/guides/trl.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from grpo.config import trl_convert as cv
from grpo.errors import ConfigError

log = logging.getLogger("grpo.config")

SAME, MAPPED, REFUSED, IGNORED = "same", "mapped", "refused", "ignored"


@dataclass(frozen=True)
class TrlName:
    kind: str
    note: str = ""  # the table's explanation; a refused name's error
    convert: Callable[[Any, dict], dict] | None = None  # (value, every given key) -> grpo fields
    accepts: tuple = ()  # refused: values that ask for what grpo does anyway
    to: str = ""  # the grpo fields it sets, for the table


def same(note: str = "", convert=None) -> TrlName:
    return TrlName(SAME, note, convert)


def mapped(to: str, convert, note: str = "") -> TrlName:
    return TrlName(MAPPED, note, convert, to=to)


def refused(note: str, *accepts) -> TrlName:
    return TrlName(REFUSED, note, accepts=accepts)


def ignored(note: str) -> TrlName:
    return TrlName(IGNORED, note)


STEPS = "grpo counts training steps (each: sample, score, then num_iterations x mini_batches optimizer steps)"
HUB = ignored("grpo never uploads; `grpo export RUN` writes a plain transformers folder")
LOADER = ignored("grpo draws its prompts itself (an epoch-shuffled, keyed stream); no data loader")
DISTRIBUTED = ignored("grpo runs under torchrun; distributed_strategy=ddp or fsdp2")
LOGGING = ignored("grpo logs metrics.jsonl and its trackers (report_to) every logging_steps")
EVAL = ignored("grpo's evaluation is greedy accuracy and pass@k on the held-out prompts (eval_prompts)")
NO_COMPILE = "grpo does not compile the model; its fast decode loop has kernels of its own (rollout_engine)"
ENTROPY = "grpo holds the entropy in a band instead: entropy_target_band=[low, high] with entropy_target_knob=entropy_coef"

TRL_NAMES: dict[str, TrlName] = {
    # ---- the same field in grpo ----
    **{k: same() for k in ("num_generations", "max_completion_length", "temperature", "top_p", "top_k", "beta",
                           "num_iterations", "epsilon", "importance_sampling_level", "reward_weights",
                           "multi_objective_aggregation", "top_entropy_quantile", "entropy_coef",
                           "off_policy_mask_threshold", "sapo_temperature_neg", "sapo_temperature_pos", "adam_beta1",
                           "adam_beta2", "bf16", "gradient_checkpointing", "learning_rate", "lr_scheduler_type",
                           "max_grad_norm", "output_dir", "per_device_train_batch_size", "save_total_limit", "seed",
                           "weight_decay", "vllm_enable_sleep_mode", "vllm_server_host", "vllm_server_port",
                           "vllm_server_timeout", "vllm_gpu_memory_utilization", "max_prompt_length")},
    "max_steps": same(f"{STEPS}; TRL counts optimizer steps: the same when num_iterations = 1 and "
                      "steps_per_generation = gradient_accumulation_steps; TRL's -1 beside num_train_epochs leaves "
                      "the count to the epochs", cv.max_steps),
    "warmup_steps": same("a value in (0, 1) is a share of max_steps, as in transformers", cv.ratio_or_steps("warmup_steps")),
    "save_steps": same("a value in (0, 1) is a share of max_steps", cv.ratio_or_steps("save_steps")),
    "logging_steps": same("a value in (0, 1) is a share of max_steps", cv.ratio_or_steps("logging_steps")),
    "eval_steps": same("grpo evaluates the held-out prompts every this many steps; a value in (0, 1) is a share of "
                       "max_steps", cv.ratio_or_steps("eval_steps")),
    "resume_from_checkpoint": same("true is grpo's 'auto' (output_dir's latest checkpoint)", cv.resume),
    "report_to": same("tensorboard, wandb, trackio, mlflow (a list or comma list), all or none", cv.report_to),
    "epsilon_high": same("with loss_type=cispo it is the cap on the importance weight, grpo's cispo_ratio_max",
                         cv.epsilon_high),
    # ---- mapped onto grpo's fields ----
    "gradient_accumulation_steps": mapped("prompts_per_step, mini_batches", cv.batch,
                                          "prompts per step = per_device_train_batch_size (TRL's default 8) x processes "
                                          "x steps_per_generation / num_generations"),
    "steps_per_generation": mapped("prompts_per_step, mini_batches", cv.batch, "optimizer steps per generation "
                                   "batch: mini_batches = steps_per_generation / gradient_accumulation_steps"),
    "generation_batch_size": mapped("prompts_per_step, mini_batches", cv.batch, "prompts per step = "
                                    "generation_batch_size / num_generations"),
    "loss_type": mapped("aggregation, policy_loss", cv.loss_type, "grpo: seq_mean_token_mean; dr_grpo: "
                        "seq_mean_token_sum_norm; dapo: token_mean; bnpo: token_mean (normalised by the mini-batch's tokens, "
                        "not each micro-batch's); luspo: seq_mean_token_sum; cispo, sapo, vespo: policy_loss"),
    "scale_rewards": mapped("advantage_estimator", cv.scale_rewards, "group (true): grpo; none (false): dr_grpo; "
                            "batch: batch_std"),
    "warmup_ratio": mapped("warmup_steps", cv.warmup_ratio, "warmup_steps = ceil(warmup_ratio x max_steps)"),
    "delta": mapped("clip_delta", cv.renamed("clip_delta"), "INTELLECT-2's two-sided clip"),
    "mask_truncated_completions": mapped("overlong_filter", cv.renamed("overlong_filter")),
    "log_completions": mapped("log_completions_steps", cv.log_completions, "true: every logging_steps; false: 0"),
    "disable_tqdm": mapped("progress", cv.renamed("progress", negate=True)),
    "per_device_eval_batch_size": mapped("eval_batch_size", cv.renamed("eval_batch_size")),
    "activation_checkpointing": mapped("gradient_checkpointing", cv.renamed("gradient_checkpointing")),
    "use_vllm": mapped("rollout_engine", cv.use_vllm, "true: vllm (vllm_mode=colocate) or vllm_server (server)"),
    "vllm_mode": mapped("rollout_engine", cv.consumed, "read with use_vllm"),
    "vllm_server_base_url": mapped("vllm_server_host, vllm_server_port", cv.vllm_url),
    "vllm_importance_sampling_correction": mapped("rollout_correction", cv.is_correction, "false: none; true: "
                                                  "grpo's auto corrects vLLM rollouts"),
    "vllm_importance_sampling_mode": mapped("rollout_correction, rollout_correction_level", cv.is_mode,
                                            "{token,sequence}_{mask,truncate}"),
    "vllm_importance_sampling_clip_max": mapped("rollout_correction_high", cv.renamed("rollout_correction_high")),
    "vllm_importance_sampling_cap": mapped("rollout_correction_high", cv.renamed("rollout_correction_high"),
                                           "TRL's deprecated name"),
    "vllm_importance_sampling_clip_min": mapped("rollout_correction_low", cv.renamed("rollout_correction_low")),
    "sync_ref_model": mapped("ref_reset_steps", cv.sync_ref, "with ref_model_mixup_alpha=1 (a reset): ref_reset_steps = "
                             "ref_model_sync_steps; a mix is refused"),
    "ref_model_mixup_alpha": mapped("ref_reset_steps", cv.consumed, "read with sync_ref_model"),
    "ref_model_sync_steps": mapped("ref_reset_steps", cv.consumed, "read with sync_ref_model"),
    "max_tool_calling_iterations": mapped("max_turns", cv.tool_iterations, "max_turns = calls + 1 (the answer's turn)"),
    "model_init_kwargs": mapped("dtype", cv.model_init_kwargs, "only dtype / torch_dtype"),
    "eval_strategy": mapped("eval_steps", cv.eval_strategy, "no: eval_steps=0; steps: eval_steps (default "
                            "logging_steps); epoch refused"),
    "save_strategy": mapped("save_steps", cv.strategy("save_strategy", {"save_steps": 0}),
                            "no: only the final checkpoint; steps: save_steps; epoch, best refused"),
    # ---- refused: grpo's equivalent named ----
    "num_train_epochs": same("passes over the training split: max_steps = ceil(epochs x training prompts / "
                             "prompts_per_step) once the task is loaded; a max_steps above 0 overrides it, as in TRL. "
                             "grpo's num_iterations is TRL's num_iterations (mu, passes over each batch of rollouts), "
                             "not epochs", cv.epochs),
    "adam_epsilon": refused("adam_epsilon: grpo's AdamW keeps torch's eps of 1e-8", 1e-8),
    "optim": refused("optim: grpo's optimizer is torch's AdamW (adam_beta1, adam_beta2, weight_decay)", "adamw_torch",
                     "adamw_torch_fused", "adamw_hf"),
    "optim_args": refused("optim_args: grpo's optimizer is torch's AdamW", None),
    "optim_target_modules": refused("optim_target_modules: grpo trains every weight, or LoRA (use_peft, "
                                    "lora_target_modules)", None),
    "lr_scheduler_kwargs": refused("lr_scheduler_kwargs: grpo's schedules (constant, cosine, linear) take none", None),
    "fp16": refused("fp16: grpo trains in dtype with bf16 autocast (bf16=true) and no loss scaling; use "
                    "dtype=float16 or bf16=true", False),
    "deepspeed": refused("deepspeed: grpo shards with distributed_strategy=fsdp2 under torchrun", None),
    "fsdp": refused("fsdp: use distributed_strategy=fsdp2 under torchrun", None, False),
    "fsdp_config": refused("fsdp_config: use distributed_strategy=fsdp2 under torchrun", None),
    "data_seed": refused("data_seed: grpo's seed also draws the prompts", None),
    "label_smoothing_factor": refused("label_smoothing_factor: not a GRPO setting", 0.0),
    "neftune_noise_alpha": refused("neftune_noise_alpha: not offered", None),
    "torch_compile": same("grpo compiles the policy loss and the advantages, not the model (its fast decode loop "
                          "has kernels of its own)"),
    "torch_compile_backend": refused(f"torch_compile_backend: {NO_COMPILE}", None),
    "torch_compile_mode": refused(f"torch_compile_mode: {NO_COMPILE}", None),
    "use_liger_kernel": refused("use_liger_kernel: not offered", False),
    "auto_find_batch_size": refused("auto_find_batch_size: grpo bounds memory with max_tokens_per_forward instead", False),
    "load_best_model_at_end": refused("load_best_model_at_end: grpo keeps the last checkpoint", False),
    "train_sampling_strategy": refused("train_sampling_strategy: grpo draws an epoch-shuffled prompt stream", "random"),
    "shuffle_dataset": refused("shuffle_dataset: grpo draws an epoch-shuffled prompt stream", True),
    "parallelism_config": refused("parallelism_config: grpo runs under torchrun (distributed_strategy)", None),
    "trust_remote_code": refused("trust_remote_code: grpo loads models without remote code", False),
    "router_aux_loss_coef": refused("router_aux_loss_coef: no mixture-of-experts loss", None),
    "disable_dropout": refused("disable_dropout: grpo trains with the model's own dropout; set it to 0 in the model's "
                               "config", False),
    "num_generations_eval": refused("num_generations_eval: grpo evaluates greedily, and pass@k with eval_pass_k samples "
                                    "per prompt", None),
    "min_p": same("min_p=None in TRL is min_p=0 here (off)", convert=lambda v, _: {"min_p": 0.0 if v is None else v}),
    "repetition_penalty": same("every rollout engine applies it; the trainer's log-probs for the corrections too"),
    "generation_kwargs": same("top_p, top_k, min_p, repetition_penalty (other keys refused with the reason)"),
    "chat_template_kwargs": same("given to every rendering with the chat template, and kept as the saved template's "
                                 "defaults"),
    "vllm_model_impl": refused("vllm_model_impl: grpo uses vLLM's own model implementations", "vllm"),
    "vllm_structured_outputs_regex": refused("vllm_structured_outputs_regex: not offered", None),
    "vllm_max_model_length": refused("vllm_max_model_length: grpo sizes vLLM from max_prompt_length and "
                                     "max_completion_length", None),
    "vllm_tensor_parallel_size": refused("vllm_tensor_parallel_size: grpo runs vLLM on one device per process", 1),
    "use_bias_correction_kl": refused("use_bias_correction_kl: grpo's KL term (kl_estimator) is not weighted by the "
                                      "importance ratio", False),
    "use_adaptive_entropy": refused(f"use_adaptive_entropy: {ENTROPY}", False),
    "entropy_coef_min": refused(f"entropy_coef_min: {ENTROPY}", 0.0),
    "entropy_coef_max": refused(f"entropy_coef_max: {ENTROPY}", 1.0),
    "entropy_coef_delta": refused(f"entropy_coef_delta: {ENTROPY}", 0.005),
    "entropy_target": refused(f"entropy_target: {ENTROPY}", 0.2),
    "vespo_k_pos": same(),
    "vespo_lambda_pos": same(),
    "vespo_k_neg": same(),
    "vespo_lambda_neg": same(),
    # ---- ignored: TRL's and transformers' machinery ----
    # asked to upload, a run that silently does not would be found out only on the Hub: refused by name
    "push_to_hub": refused("push_to_hub: grpo does not upload; after the run, `grpo export RUN --out DIR` writes a plain "
                           "transformers folder (LoRA merged) and `hf upload REPO_ID DIR` pushes it", False),
    **{k: HUB for k in ("hub_model_id", "hub_strategy", "hub_token", "hub_private_repo",
                        "hub_always_push", "hub_revision", "log_completions_hub_repo")},
    **{k: LOADER for k in ("dataloader_drop_last", "dataloader_num_workers", "dataloader_pin_memory",
                           "dataloader_persistent_workers", "dataloader_prefetch_factor", "dataloader_in_order",
                           "dataloader_multiprocessing_context", "remove_unused_columns", "length_column_name",
                           "label_names", "ignore_data_skip", "pad_to_multiple_of")},
    **{k: DISTRIBUTED for k in ("ddp_backend", "ddp_broadcast_buffers", "ddp_bucket_cap_mb", "ddp_find_unused_parameters",
                                "ddp_static_graph", "ddp_timeout", "local_rank", "accelerator_config",
                                "average_tokens_across_devices", "ds3_gather_for_generation", "save_on_each_node",
                                "log_on_each_node")},
    **{k: LOGGING for k in ("logging_strategy", "logging_first_step", "logging_nan_inf_filter", "log_level",
                            "log_level_replica", "run_name", "project", "trackio_space_id", "trackio_bucket_id",
                            "trackio_static_space_id", "skip_memory_metrics", "include_num_input_tokens_seen",
                            "log_multimodal", "num_completions_to_print", "log_unique_prompts", "debug")},
    **{k: EVAL for k in ("do_train", "do_eval", "do_predict", "eval_delay", "eval_on_start", "eval_accumulation_steps",
                         "eval_do_concat_batches", "eval_use_gather_object", "batch_eval_metrics", "include_for_metrics",
                         "prediction_loss_only", "metric_for_best_model", "greater_is_better", "bf16_full_eval",
                         "fp16_full_eval")},
    "gradient_checkpointing_kwargs": ignored("grpo's gradient checkpointing is always transformers' non-reentrant one"),
    "activation_checkpointing_kwargs": ignored("grpo's gradient checkpointing is always transformers' non-reentrant one"),
    "cast_lm_head_to_fp32": ignored("grpo keeps the LM head in float32 under bf16 autocast anyway"),
    "tf32": ignored("grpo leaves torch's TF32 setting as it is"),
    "use_cpu": ignored("grpo trains on the device torch finds (CUDA, else the CPU)"),
    "use_cache": ignored("grpo's rollout engines keep their own KV cache"),
    "torch_empty_cache_steps": ignored("grpo manages its own memory between steps (reuse_freed_memory on the CPU)"),
    "full_determinism": ignored("grpo seeds everything from seed; the same seed gives the same run"),
    "restore_callback_states_from_checkpoint": ignored("grpo has no callbacks; a checkpoint holds every component's state"),
    "save_only_model": ignored("a grpo checkpoint always holds what an exact resume needs"),
    "save_safetensors": ignored("grpo saves safetensors"),
    "enable_jit_checkpoint": ignored("grpo always saves a checkpoint on SIGTERM and SIGINT"),
    "liger_kernel_config": ignored("grpo does not use liger kernels"),
    "cache_implementation": ignored("grpo's rollout engines keep their own KV cache"),
    "vllm_group_port": ignored("grpo sends vLLM the weights over HTTP (vllm_server_weight_dir), no NCCL group"),
    "use_transformers_continuous_batching": ignored("grpo samples with its own rollout engines (rollout_engine)"),
    "transformers_continuous_batching_config": ignored("grpo samples with its own rollout engines (rollout_engine)"),
    "use_transformers_paged": ignored("grpo samples with its own rollout engines (rollout_engine)"),
    # ---- AsyncGRPOConfig's own fields (trl.experimental.async_grpo); grpo.AsyncGRPOConfig sets async_rollouts ----
    "max_staleness": same("AsyncGRPOConfig: the optimizer steps a trained sample may lag (TRL's default 4)"),
    "dtype": same("AsyncGRPOConfig: the policy's parameter dtype"),
    "request_timeout": mapped("vllm_server_request_timeout", cv.renamed("vllm_server_request_timeout"),
                              "AsyncGRPOConfig: the deadline of one request to the vLLM server"),
    "weight_sync_steps": refused("weight_sync_steps: grpo publishes the new weights to the rollout engine after every "
                                 "step; max_staleness bounds how far sampling may run ahead of them", 1),
    "token_budget": mapped("max_tokens_per_forward", cv.renamed("max_tokens_per_forward"),
                           "AsyncGRPOConfig: tokens of one forward/backward pass (grpo packs micro-batches to it)"),
    "fork_threshold_tokens": ignored("AsyncGRPOConfig: grpo's multi-turn episodes keep the sampled tokens and never "
                                     "re-tokenize a conversation, so there is no drift to realign"),
    "max_inflight_tasks": ignored("AsyncGRPOConfig: grpo's producer draws whole steps ahead, at most max_staleness"),
    "queue_maxsize": ignored("AsyncGRPOConfig: grpo's producer holds at most max_staleness steps' draws"),
    "weight_sync_timeout": ignored("AsyncGRPOConfig: grpo's weight pushes have the engine's own deadlines "
                                   "(vllm_server_timeout)"),
    "heartbeat_stale_after_s": ignored("AsyncGRPOConfig: grpo's producer is a thread of the trainer (or its engine "
                                       "process), whose death ends the run at once"),
}


def translate(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` (the given keys, grpo's and TRL's) with TRL's names replaced by the grpo ``fields``
    they set. A refused name, a TRL name whose grpo field is also given, and two names that set one
    field differently are ConfigErrors naming the keys; ignored names are named in one warning."""
    out = {k: v for k, v in values.items() if k not in TRL_NAMES or (TRL_NAMES[k].kind == SAME and
                                                                      TRL_NAMES[k].convert is None)}
    source: dict[str, str] = {}
    skipped = []
    for key, raw in values.items():
        entry = TRL_NAMES.get(key)
        if entry is None or (entry.kind == SAME and entry.convert is None):
            continue
        if entry.kind == IGNORED:
            skipped.append(key)
            continue
        if entry.kind == REFUSED:
            if cv.accepted(raw, entry.accepts):
                continue
            raise ConfigError(entry.note)
        for field, value in entry.convert(raw, values).items():
            if field != key and field in values:
                raise ConfigError(f"{key}: sets {field}, which is also given; give one of them")
            if field in source and out[field] != value:
                raise ConfigError(f"{key}: sets {field} to {value!r}, but {source[field]} sets it to {out[field]!r}")
            out[field], source[field] = value, key
    if skipped:
        log.warning("TRL settings ignored (they do not change what grpo trains; docs/guides/trl.md): %s", ", ".join(skipped))
    return out


def markdown_table() -> str:
    """docs/guides/trl.md's table: every TRL name, what grpo does with it (with grpo's default where it is
    grpo's field too), and why."""
    import dataclasses

    from grpo.config.fields import Config

    defaults = {f.name: f.default for f in dataclasses.fields(Config)}
    rows = ["| TRL name | grpo | note |", "| --- | --- | --- |"]
    for kind in (SAME, MAPPED, REFUSED, IGNORED):
        for name in sorted(k for k, e in TRL_NAMES.items() if e.kind == kind):
            e = TRL_NAMES[name]
            grpo = {SAME: f"`{name}`", MAPPED: ", ".join(f"`{f.strip()}`" for f in e.to.split(",")),
                    REFUSED: "refused" + (f" (accepts {', '.join(repr(a) for a in e.accepts)})" if e.accepts else ""),
                    IGNORED: "ignored"}[kind]
            note = e.note.removeprefix(f"{name}: ")
            if kind == SAME:
                note = "; ".join(x for x in (f"grpo's default `{defaults[name]!r}`", note) if x)
            rows.append(f"| `{name}` | {grpo} | {note} |")
    return "\n".join(rows)
