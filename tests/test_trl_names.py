"""TRL's GRPOConfig names: every field of the installed TRL has an entry; mapped names give grpo's
fields (TRL's own batch arithmetic reproduced); refused names name grpo's equivalent; docs/guides/trl.md is
the generated table."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import pytest

from grpo.config import Config, ConfigError, load_config
from grpo.config.io import config_from
from grpo.config.trl_names import IGNORED, MAPPED, REFUSED, SAME, TRL_NAMES

trl = pytest.importorskip("trl")  # the dev extra installs it; without it there is nothing to check against
FIELDS = {f.name for f in dataclasses.fields(Config)}


def _trl_fields() -> set[str]:
    return {f.name for f in dataclasses.fields(trl.GRPOConfig)}


def test_every_field_of_the_installed_trl_has_an_entry():
    missing = sorted(_trl_fields() - set(TRL_NAMES))
    assert not missing, f"TRL {trl.__version__}'s GRPOConfig fields without an entry in TRL_NAMES: {missing}"


STORED = json.loads((Path(__file__).parent / "fixtures" / "trl" / "trl-1.16.0-fields.json").read_text())


def test_every_field_of_the_stored_newest_trl_has_an_entry():
    """TRL 1.16.0's GRPOConfig and AsyncGRPOConfig fields, stored (its source: the file's "source"), each have an
    entry or are grpo's own field, whether or not TRL is installed here."""
    assert STORED["version"] == "1.16.0" and len(STORED["GRPOConfig"]) > 150
    assert not sorted(set(STORED["GRPOConfig"]) - set(TRL_NAMES))
    assert not sorted(set(STORED["AsyncGRPOConfig"]) - set(TRL_NAMES) - FIELDS)


def test_the_installed_trl_is_the_stored_version_or_its_fields_are_covered_too():
    from trl.experimental.async_grpo import AsyncGRPOConfig

    fields = {f.name for f in dataclasses.fields(AsyncGRPOConfig)}
    assert not sorted(fields - set(TRL_NAMES) - FIELDS), f"TRL {trl.__version__}'s AsyncGRPOConfig"
    if trl.__version__ == STORED["version"]:
        assert _trl_fields() == set(STORED["GRPOConfig"]) and fields == set(STORED["AsyncGRPOConfig"])


def test_async_grpo_config_is_what_trls_async_trainer_trains():
    from grpo import AsyncGRPOConfig, GRPOConfig

    cfg = AsyncGRPOConfig(max_staleness=2, request_timeout=30, token_budget=512)
    assert (cfg.async_rollouts, cfg.max_staleness, cfg.aggregation, cfg.beta) == (True, 2, "token_mean", 0.0)
    assert (cfg.vllm_server_request_timeout, cfg.max_tokens_per_forward) == (30, 512)
    assert AsyncGRPOConfig(loss_type="dr_grpo", beta=0.04).aggregation == "seq_mean_token_sum_norm"
    assert AsyncGRPOConfig().max_staleness == 4  # TRL's AsyncGRPOConfig default
    with pytest.raises(ConfigError, match="^weight_sync_steps: grpo publishes"):
        AsyncGRPOConfig(weight_sync_steps=4)
    assert not GRPOConfig().async_rollouts


def test_async_grpo_trainer_trains_with_asynchronous_rollouts(tmp_path, tiny_model_dir, tiny_dataset):
    from grpo import AsyncGRPOConfig, AsyncGRPOTrainer, GRPOConfig

    common = dict(output_dir=str(tmp_path / "a"), max_steps=1, num_generations=2, prompts_per_step=2,
                  max_completion_length=4, eval_prompts=0, progress=False, report_to="none", bf16=False)
    trainer = AsyncGRPOTrainer(model=str(tiny_model_dir), reward_funcs=["numeric"],
                               args=AsyncGRPOConfig(**common), train_dataset=str(tiny_dataset))
    trainer.train()
    metrics = [json.loads(l) for l in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 1 and "async/staleness_mean" in metrics[0]
    plain = AsyncGRPOTrainer(model=str(tiny_model_dir), reward_funcs=["numeric"],
                             args=GRPOConfig(**{**common, "output_dir": str(tmp_path / "b")}),
                             train_dataset=str(tiny_dataset))
    assert plain.trainer.cfg.async_rollouts


def test_entries_name_grpo_fields():
    for name, e in TRL_NAMES.items():
        assert e.kind in (SAME, MAPPED, REFUSED, IGNORED), name
        if e.kind == SAME:
            assert name in FIELDS, f"{name} is listed as grpo's own field"
        if e.kind == MAPPED:
            assert {f.strip() for f in e.to.split(",")} <= FIELDS, name
        if e.kind == REFUSED:
            assert e.note.startswith(f"{name}: "), f"{name}'s error must name it"


def test_the_names_the_issue_tried():
    cfg = load_config(None, ["gradient_accumulation_steps=4", "loss_type=dr_grpo", "scale_rewards=false",
                             "warmup_ratio=0.1", "max_steps=20"])
    assert (cfg.prompts_per_step, cfg.mini_batches) == (4, 1)  # 8 completions x 4 micro-batches / 8 per group
    assert cfg.aggregation == "seq_mean_token_sum_norm" and cfg.advantage_estimator == "dr_grpo"
    assert cfg.warmup_steps == 2  # ceil(0.1 x 20), transformers' rule
    assert load_config(None, ["num_train_epochs=1"]).num_train_epochs == 1.0  # steps: once the task is loaded


def test_num_train_epochs_follows_trls_rules_beside_max_steps():
    assert load_config(None, ["num_train_epochs=2", "max_steps=7"]).num_train_epochs is None  # max_steps > 0 wins
    cfg = load_config(None, ["num_train_epochs=2", "max_steps=-1"])  # TRL's "not set"
    assert (cfg.num_train_epochs, cfg.max_steps) == (2.0, 25)
    assert load_config(None, ["max_steps=-1"]).num_train_epochs == 3.0  # alone: TRL's default of 3 epochs
    with pytest.raises(ConfigError, match=r"^warmup_ratio: a share of max_steps needs max_steps"):
        load_config(None, ["num_train_epochs=1", "warmup_ratio=0.1"])
    with pytest.raises(ConfigError, match=r"^num_train_epochs: must be > 0"):
        load_config(None, ["num_train_epochs=0"])


def test_the_saved_config_holds_grpos_names(tmp_path):
    cfg = config_from({"gradient_accumulation_steps": 2, "loss_type": "dapo", "use_vllm": False, "push_to_hub": False},
                      "GRPOConfig(...)")
    cfg.save(tmp_path / "c.yaml")
    again = load_config(tmp_path / "c.yaml")
    assert again == cfg and again.aggregation == "token_mean" and again.prompts_per_step == 2
    assert not set(cfg.to_dict()) - FIELDS


@pytest.mark.parametrize("kw", [{}, {"gradient_accumulation_steps": 4},
                                {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "num_generations": 4},
                                {"steps_per_generation": 4, "gradient_accumulation_steps": 2},
                                {"generation_batch_size": 64, "num_generations": 8}])
def test_batch_arithmetic_matches_trls_own(kw):
    """TRL's GRPOConfig derives its generation batch; grpo's prompts_per_step x num_generations is that
    batch and mini_batches its optimizer steps (steps_per_generation / gradient_accumulation_steps)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = trl.GRPOConfig(output_dir="unused", use_cpu=True, bf16=False, **kw)
    ours = config_from({**kw, "gradient_accumulation_steps": theirs.gradient_accumulation_steps}, "test")
    assert ours.prompts_per_step * ours.num_generations == theirs.generation_batch_size
    assert ours.mini_batches == theirs.steps_per_generation // theirs.gradient_accumulation_steps


@pytest.mark.parametrize("given, want", [
    ({"loss_type": "cispo", "epsilon_high": 4.0}, {"policy_loss": "cispo", "cispo_ratio_max": 4.0, "aggregation": "token_mean"}),
    ({"epsilon_high": 0.28}, {"epsilon_high": 0.28}),
    ({"scale_rewards": "batch"}, {"advantage_estimator": "batch_std"}),
    ({"scale_rewards": True}, {"advantage_estimator": "grpo"}),
    ({"mask_truncated_completions": True, "delta": 4.0}, {"overlong_filter": True, "clip_delta": 4.0}),
    ({"log_completions": True, "logging_steps": 3}, {"log_completions_steps": 3}),
    ({"disable_tqdm": True}, {"progress": False}),
    ({"resume_from_checkpoint": False}, {"resume_from_checkpoint": None}),
    ({"warmup_steps": 0.25, "max_steps": 10}, {"warmup_steps": 3}),
    ({"sync_ref_model": True, "ref_model_mixup_alpha": 1.0, "ref_model_sync_steps": 5}, {"ref_reset_steps": 5}),
    ({"max_tool_calling_iterations": 2}, {"max_turns": 3}),
    ({"model_init_kwargs": {"torch_dtype": "bfloat16"}}, {"dtype": "bfloat16"}),
    ({"loss_type": "bnpo"}, {"aggregation": "token_mean"}),
    ({"loss_type": "luspo", "importance_sampling_level": "sequence"},
     {"aggregation": "seq_mean_token_sum", "importance_sampling_level": "sequence"}),
    ({"loss_type": "vespo", "vespo_k_pos": 1.5}, {"policy_loss": "vespo", "aggregation": "token_mean", "vespo_k_pos": 1.5}),
    ({"report_to": "all"}, {"report_to": "all"}),
    ({"report_to": ["tensorboard", "trackio"]}, {"report_to": "tensorboard,trackio"}),
    ({"report_to": "mlflow,wandb"}, {"report_to": "mlflow,wandb"}),
    ({"eval_strategy": "no"}, {"eval_steps": 0}),
    ({"eval_strategy": "steps", "logging_steps": 2}, {"eval_steps": 2}),
    ({"vllm_server_base_url": "http://10.0.0.2:8123"}, {"vllm_server_host": "10.0.0.2", "vllm_server_port": 8123}),
    ({"adam_epsilon": 1e-8, "optim": "adamw_torch", "fp16": False, "push_to_hub": False}, {}),
], ids=lambda x: ",".join(x) if isinstance(x, dict) else None)
def test_mapped_and_accepted_values(given, want):
    cfg = config_from(dict(given), "test")
    for key, value in want.items():
        assert getattr(cfg, key) == value, key


@pytest.mark.parametrize("given, message", [
    ({"gradient_accumulation_steps": 2, "prompts_per_step": 4}, r"^gradient_accumulation_steps: sets prompts_per_step, "
                                                                r"which is also given; give one of them$"),
    ({"loss_type": "gspo"}, r"^loss_type: 'gspo' has no grpo equivalent"),
    ({"adam_epsilon": 1e-6}, r"^adam_epsilon: grpo's AdamW keeps torch's eps of 1e-8$"),
    ({"fp16": True}, r"^fp16: "),
    ({"sync_ref_model": True}, r"^sync_ref_model: .* ref_model_mixup_alpha=0.6 is not offered$"),
    ({"generation_batch_size": 12}, r"generation batch of 12 completions must be a multiple of num_generations=8"),
    ({"eval_strategy": "epoch"}, r"^eval_strategy: grpo counts steps, not epochs"),
    ({"scale_rewards": "maybe"}, r"^scale_rewards: 'maybe' is not valid"),
    ({"push_to_hub": True, "hub_model_id": "me/run"}, r"^push_to_hub: grpo does not upload; .*grpo export RUN --out DIR"),
])
def test_refused_values_name_grpos_equivalent(given, message):
    with pytest.raises(ConfigError, match=message):
        config_from(given, "test")


def test_command_line_strings_are_read_as_trls_types():
    cfg = load_config(None, ["scale_rewards=batch", "mask_truncated_completions=true", "adam_epsilon=1e-8",
                             "use_vllm=false", "disable_tqdm=true", "per_device_eval_batch_size=16"])
    assert cfg.advantage_estimator == "batch_std" and cfg.overlong_filter and not cfg.progress
    assert cfg.eval_batch_size == 16 and cfg.rollout_engine == "auto"


def test_an_unknown_name_suggests_trls_and_grpos():
    with pytest.raises(ConfigError, match=r"unknown config key 'num_train_epoch' .*did you mean num_train_epochs"):
        load_config(None, ["num_train_epoch=1"])
