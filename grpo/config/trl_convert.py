"""Converters from TRL's GRPOConfig values to grpo's fields: each ``(value, every given key) -> {grpo
field: value}``, used by the entries of ``grpo.config.trl_names.TRL_NAMES``. A value may be a YAML
value or a command-line string; a value grpo cannot take is a ConfigError naming the key."""

from __future__ import annotations

import math
import os

import yaml

from grpo.errors import ConfigError


def _load(raw):
    """A command-line string read as YAML reads a value (true, 3, 0.5, null, [a, b]); others as they are."""
    if isinstance(raw, str):
        try:
            return yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            return raw
    return raw


def _number(key: str, raw) -> float:
    value = _load(raw)
    try:
        if isinstance(value, bool):
            raise ValueError
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: expected a number, got {raw!r}") from None


def _bool(key: str, raw) -> bool:
    value = _load(raw)
    if isinstance(value, bool):
        return value
    raise ConfigError(f"{key}: expected true or false, got {raw!r}")


def accepted(raw, accepts: tuple) -> bool:
    value = _load(raw)
    for ok in accepts:
        if isinstance(ok, float) and not isinstance(value, bool):
            try:
                if math.isclose(float(value), ok, rel_tol=1e-9, abs_tol=0.0):
                    return True
            except (TypeError, ValueError):
                pass
        elif value == ok or (ok in (None, "", {}, []) and value in (None, "", {}, [])):
            return True
    return False


def _given(values: dict, key: str, default):
    return _load(values[key]) if key in values else default


def _max_steps(values: dict, field: str) -> int:
    """The max_steps a share of it is taken of; a ConfigError naming ``field`` where num_train_epochs
    decides it (known only once the task is loaded)."""
    steps = int(_number("max_steps", _given(values, "max_steps", 25)))
    if steps <= 0 or ("num_train_epochs" in values and "max_steps" not in values):
        raise ConfigError(f"{field}: a share of max_steps needs max_steps; with num_train_epochs give {field} in steps")
    return steps


def ratio_or_steps(field: str):
    """An int is steps; a float in (0, 1) a ratio of max_steps (transformers' rule: rounded up)."""
    def convert(raw, values):
        x = _number(field, raw)
        if 0 < x < 1:
            return {field: math.ceil(x * _max_steps(values, field))}
        return {field: raw}
    return convert


TRL_EPOCHS = 3.0  # TRL's (transformers') num_train_epochs default, what its max_steps=-1 trains for


def max_steps(raw, values):
    """max_steps; TRL's -1 ("train for num_train_epochs") leaves the count to the epochs: those given,
    else TRL's default of TRL_EPOCHS."""
    if _number("max_steps", raw) <= 0:
        return {} if "num_train_epochs" in values else {"num_train_epochs": TRL_EPOCHS}
    return {"max_steps": raw}


def epochs(raw, values):
    """num_train_epochs, unless a max_steps above 0 is given too, which overrides it (TRL's rule); TRL's
    max_steps=-1 ("not set") is grpo's max_steps left to the epochs."""
    steps = _given(values, "max_steps", None)
    if steps is not None and _number("max_steps", steps) > 0:
        return {"num_train_epochs": None}
    return {"num_train_epochs": raw}


def warmup_ratio(raw, values):
    return {"warmup_steps": math.ceil(_number("warmup_ratio", raw) * _max_steps(values, "warmup_ratio"))}


def batch(raw, values):
    """TRL's batch arithmetic (per_device_train_batch_size completions per micro-batch, default 8;
    gradient_accumulation_steps micro-batches per optimizer step; steps_per_generation optimizer steps
    per generation batch, default gradient_accumulation_steps) as prompts_per_step and mini_batches."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_device = int(_number("per_device_train_batch_size", _given(values, "per_device_train_batch_size", 8)))
    accumulation = int(_number("gradient_accumulation_steps", _given(values, "gradient_accumulation_steps", 1)))
    group = int(_number("num_generations", _given(values, "num_generations", 8)))
    per_step = per_device * world * accumulation  # completions per optimizer step
    generation = int(_number("generation_batch_size", _given(values, "generation_batch_size",
                     per_device * world * int(_number("steps_per_generation", _given(values, "steps_per_generation", accumulation))))))
    if generation % group or generation % per_step:
        raise ConfigError(f"gradient_accumulation_steps / steps_per_generation / generation_batch_size: a generation batch "
                          f"of {generation} completions must be a multiple of num_generations={group} and of the "
                          f"{per_step} completions of one optimizer step (per_device_train_batch_size={per_device} x "
                          f"{world} processes x gradient_accumulation_steps={accumulation})")
    return {"prompts_per_step": generation // group, "mini_batches": generation // per_step}


# TRL's loss types (trl/trainer/grpo_trainer.py, 1.16.0). bnpo divides by the tokens of one micro-batch where
# grpo's token_mean divides by the whole mini-batch's: equal where one micro-batch holds it, and unlike TRL's
# independent of per_device_train_batch_size
LOSS_TYPES = {"grpo": {"aggregation": "seq_mean_token_mean"}, "dr_grpo": {"aggregation": "seq_mean_token_sum_norm"},
              "bnpo": {"aggregation": "token_mean"}, "luspo": {"aggregation": "seq_mean_token_sum"},
              "vespo": {"policy_loss": "vespo", "aggregation": "token_mean"},
              "dapo": {"aggregation": "token_mean"}, "cispo": {"policy_loss": "cispo", "aggregation": "token_mean"},
              "sapo": {"policy_loss": "sapo", "aggregation": "seq_mean_token_mean"}}


def loss_type(raw, values):
    kind = str(_load(raw))
    if kind not in LOSS_TYPES:
        raise ConfigError(f"loss_type: {kind!r} has no grpo equivalent; grpo offers {', '.join(LOSS_TYPES)} (its "
                          f"policy losses: policy_loss=...; aggregations: aggregation=...)")
    return dict(LOSS_TYPES[kind])


def epsilon_high(raw, values):
    # with loss_type=cispo, TRL's epsilon_high is the cap on the importance weight itself
    return {"cispo_ratio_max": raw} if str(_load(values.get("loss_type"))) == "cispo" else {"epsilon_high": raw}


def scale_rewards(raw, values):
    value = _load(raw)
    choice = {True: "group", False: "none"}.get(value, value) if isinstance(value, bool) else str(value)
    estimators = {"group": "grpo", "none": "dr_grpo", "batch": "batch_std"}
    if choice not in estimators:
        raise ConfigError(f"scale_rewards: {raw!r} is not valid; choose group (true), batch or none (false)")
    return {"advantage_estimator": estimators[choice]}


def log_completions(raw, values):
    on = _bool("log_completions", raw)
    return {"log_completions_steps": _given(values, "logging_steps", 1) if on else 0}


def use_vllm(raw, values):
    if not _bool("use_vllm", raw):
        return {}
    mode = str(_given(values, "vllm_mode", "colocate"))
    if mode not in ("colocate", "server"):
        raise ConfigError(f"vllm_mode: {mode!r} is not valid; choose colocate or server")
    return {"rollout_engine": "vllm" if mode == "colocate" else "vllm_server"}


def vllm_url(raw, values):
    from urllib.parse import urlparse

    url = urlparse(str(_load(raw)))
    if not url.hostname:
        raise ConfigError(f"vllm_server_base_url: {raw!r} is not a URL such as http://host:8000")
    return {"vllm_server_host": url.hostname, **({"vllm_server_port": url.port} if url.port else {})}


def is_correction(raw, values):
    return {} if _bool("vllm_importance_sampling_correction", raw) else {"rollout_correction": "none"}


def is_mode(raw, values):
    if not _bool("vllm_importance_sampling_correction", values.get("vllm_importance_sampling_correction", True)):
        return {}
    level, _, mode = str(_load(raw)).partition("_")
    if level not in ("token", "sequence") or mode not in ("mask", "truncate"):
        raise ConfigError(f"vllm_importance_sampling_mode: {raw!r} is not token_mask, token_truncate, sequence_mask "
                          "or sequence_truncate")
    return {"rollout_correction": mode, "rollout_correction_level": level}


def sync_ref(raw, values):
    if not _bool("sync_ref_model", raw):
        return {}
    alpha = _number("ref_model_mixup_alpha", _given(values, "ref_model_mixup_alpha", 0.6))
    if alpha != 1.0:
        raise ConfigError(f"sync_ref_model: grpo resets the reference to the policy (ref_reset_steps, TR-DPO's alpha = "
                          f"1); a mix with ref_model_mixup_alpha={alpha:g} is not offered")
    return {"ref_reset_steps": int(_number("ref_model_sync_steps", _given(values, "ref_model_sync_steps", 512)))}


def tool_iterations(raw, values):
    value = _load(raw)
    return {} if value is None else {"max_turns": int(_number("max_tool_calling_iterations", value)) + 1}


def model_init_kwargs(raw, values):
    kw = dict(_load(raw) or {})
    dtype = kw.pop("dtype", kw.pop("torch_dtype", None))
    if kw:
        raise ConfigError(f"model_init_kwargs: grpo loads the model itself and takes only dtype here, not "
                          f"{', '.join(sorted(kw))}")
    return {} if dtype in (None, "auto") else {"dtype": str(dtype).removeprefix("torch.")}


def strategy(field: str, off: dict):
    def convert(raw, values):
        value = _load(raw)
        value = "no" if value is False else str(value)  # YAML reads a bare no as false
        if value == "no":
            return dict(off)
        if value == "steps":
            return {}
        raise ConfigError(f"{field}: grpo counts steps, not epochs; use {field}=steps (or no) and its *_steps")
    return convert


def eval_strategy(raw, values):
    if _load(raw) == "steps" and "eval_steps" not in values:  # transformers: defaults to logging_steps
        return {"eval_steps": _given(values, "logging_steps", 1)}
    return strategy("eval_strategy", {"eval_steps": 0})(raw, values)


def report_to(raw, values):
    """transformers' report_to (a name, a list, "all" or "none"): the trackers grpo has of those; "all":
    every tracker installed here (grpo's own "all")."""
    from grpo.infra.trackers import TRACKERS

    value = _load(raw)
    names = [str(v).strip() for v in (value if isinstance(value, list) else str(value).split(","))]
    if names in (["all"], ["none"]):
        return {"report_to": names[0]}
    unknown = [n for n in names if n and n not in TRACKERS]
    if unknown:
        raise ConfigError(f"report_to: grpo reports to {', '.join(TRACKERS)} (a comma list), all or none; "
                          f"it has no {', '.join(map(repr, unknown))}")
    return {"report_to": ",".join(n for n in names if n) or "none"}


def resume(raw, values):
    value = _load(raw)
    return {"resume_from_checkpoint": ("auto" if value else None) if isinstance(value, bool) else raw}


def renamed(field: str, negate: bool = False):
    def convert(raw, values):
        return {field: (not _bool(field, raw)) if negate else raw}
    return convert


def consumed(raw, values):
    return {}  # read by another entry's converter
