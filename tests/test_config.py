"""Config: YAML + key=value, type coercion, validation that names the key, docs generated once."""

import dataclasses
import re

import pytest
import yaml

from grpo.config import Config, ConfigError
from grpo.config.io import field_docs, keys_help, load_config
from grpo.config.sections import SECTION_OF, SECTIONS, field_order


def test_defaults_are_valid_and_documented():
    cfg = Config()
    docs = field_docs()
    missing = [f.name for f in dataclasses.fields(Config) if not docs.get(f.name)]
    assert not missing, f"fields without a docstring: {missing}"
    assert cfg.eps_high == cfg.epsilon and cfg.sequences_per_step == 32


def test_trl_names_exist():
    names = {f.name for f in dataclasses.fields(Config)}
    for key in ("model", "task", "output_dir", "seed", "max_steps", "num_generations", "prompts_per_step",
                "max_completion_length", "temperature", "learning_rate", "beta", "num_iterations", "save_steps",
                "epsilon", "epsilon_high", "importance_sampling_level", "max_grad_norm", "lr_scheduler_type"):
        assert key in names, key


def test_yaml_then_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({"beta": 0.1, "num_generations": 4, "reward_weights": [1, 0.5],
                                 "rewards": "numeric,format"}))
    cfg = load_config(p, ["beta=0", "epsilon_high=0.28", "use_peft=true", "learning_rate=1e-6"])
    assert cfg.beta == 0.0 and cfg.num_generations == 4 and cfg.eps_high == 0.28 and cfg.use_peft is True
    assert cfg.learning_rate == 1e-6 and cfg.reward_weights == [1.0, 0.5]
    assert load_config(None, ["epsilon_high=null"]).epsilon_high is None


@pytest.mark.parametrize("override, key", [
    ("num_generations=abc", "num_generations"),
    ("beta=yes", "beta"),
    ("use_peft=maybe", "use_peft"),
    ("max_completion_length=-4", "max_completion_length"),
    ("advantage_estimator=ppo2", "advantage_estimator"),
    ("aggregation=sum", "aggregation"),
    ("kl_estimator=k9", "kl_estimator"),
    ("temperature=0", "temperature"),
    ("per_device_train_batch_size=5", "per_device_train_batch_size"),
    ("dual_clip=0.5", "dual_clip"),
    ("max_steps=2.5", "max_steps"),
    ("max_steps=25e-1", "max_steps"),  # e-notation is no way around a whole number
    ("max_steps=1.5e0", "max_steps"),
])
def test_bad_values_name_the_key(override, key):
    """Each bad value's whole message: the key first, then what it expects (type, bound, the valid
    choices, or both numbers of the divisibility rule) and what it got."""
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert str(err.value) == BAD_VALUE_MESSAGES[override] and str(err.value).startswith(f"{key}: ")


BAD_VALUE_MESSAGES = {
    "num_generations=abc": "num_generations: expected int, got 'abc'",
    "beta=yes": "beta: expected float, got 'yes'",
    "use_peft=maybe": "use_peft: expected bool, got 'maybe'",
    "max_completion_length=-4": "max_completion_length: must be >= 1, got -4",
    "advantage_estimator=ppo2": "advantage_estimator: 'ppo2' is not valid; choose one of ['batch_std', 'dr_grpo', "
                                "'gae', 'grpo', 'mean_baseline', 'reinforce', 'rloo']",
    "aggregation=sum": "aggregation: 'sum' is not valid; choose one of ['seq_mean_token_mean', "
                       "'seq_mean_token_sum', 'seq_mean_token_sum_norm', 'token_mean']",
    "kl_estimator=k9": "kl_estimator: 'k9' is not valid; choose one of ['k1', 'k2', 'k3']",
    "temperature=0": "temperature: must be > 0, got 0.0",
    "per_device_train_batch_size=5": "per_device_train_batch_size: prompts_per_step * num_generations = 32 is not "
                                     "a multiple of 5; use one of [1, 2, 4, 8, 16, 32] (unset: 8)",
    "dual_clip=0.5": "dual_clip: must be > 1 (or null), got 0.5",
    "max_steps=2.5": "max_steps: expected int, got '2.5'",
    "max_steps=25e-1": "max_steps: expected int, got '25e-1'",
    "max_steps=1.5e0": "max_steps: expected int, got '1.5e0'",
}


def test_whole_numbers_in_e_notation_are_integers():
    cfg = load_config(None, ["max_steps=1e3", "save_steps=2.0", "warmup_steps=20E-1"])
    assert (cfg.max_steps, cfg.save_steps, cfg.warmup_steps) == (1000, 2, 2)
    assert all(type(v) is int for v in (cfg.max_steps, cfg.save_steps, cfg.warmup_steps))


def test_choices_are_listed():
    with pytest.raises(ConfigError, match="dr_grpo.*grpo.*rloo"):
        load_config(None, ["advantage_estimator=ppo2"])


def test_unknown_key_suggests_close_match(tmp_path):
    with pytest.raises(ConfigError, match="num_generation.*did you mean num_generations"):
        load_config(None, ["num_generation=4"])
    p = tmp_path / "c.yaml"
    p.write_text("lernin_rate: 0.1\n")
    with pytest.raises(ConfigError, match=str(p)):
        load_config(p)


def test_group_of_one_needs_num_generations_at_least_two_with_a_group_estimator():
    # the G >= 2 rule's own message: G = 1 would also break the micro-batch divisibility rule here
    with pytest.raises(ConfigError, match="num_generations: 'grpo' compares completions within a group "
                                          "and needs num_generations >= 2, got 1"):
        load_config(None, ["num_generations=1", "per_device_train_batch_size=4"])


def test_group_of_one_allowed_without_group_estimator():
    assert load_config(None, ["num_generations=1", "advantage_estimator=reinforce",
                              "per_device_train_batch_size=4"]).num_generations == 1


def test_missing_config_file():
    with pytest.raises(ConfigError, match="^config file /nonexistent.yaml does not exist$"):
        load_config("/nonexistent.yaml")


def test_saved_config_round_trips(tmp_path):
    cfg = load_config(None, ["beta=0.2", "epsilon_high=0.3"])
    cfg.save(tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == cfg


def test_every_field_has_exactly_one_section():
    names = [f.name for f in dataclasses.fields(Config)]
    listed = [f for s in SECTIONS for f in s.fields]
    twice = sorted({f for f in listed if listed.count(f) > 1})
    assert not twice, f"fields in more than one section of grpo/config/sections.py: {twice}"
    assert not set(names) - set(listed), f"fields without a section in grpo/config/sections.py: {sorted(set(names) - set(listed))}"
    assert not set(listed) - set(names), f"sections name fields Config does not have: {sorted(set(listed) - set(names))}"
    assert len({s.name for s in SECTIONS}) == len(SECTIONS)


def test_fields_are_written_section_by_section():
    """fields.py holds the fields in the sections' order, so the file reads by topic as the help does."""
    names = [f.name for f in dataclasses.fields(Config)]
    first_wrong = next((i for i, (a, b) in enumerate(zip(names, field_order())) if a != b), None)
    assert first_wrong is None, (f"grpo/config/fields.py: field {names[first_wrong]!r} stands where "
                                 f"{field_order()[first_wrong]!r} (section {SECTION_OF[field_order()[first_wrong]]!r}) "
                                 f"belongs: write fields in the order of grpo/config/sections.py")


def test_help_of_one_section_lists_only_its_keys():
    text = keys_help("rewards")
    keys = [line.split()[0] for line in text.splitlines()[1:] if line.startswith("  ")]
    assert keys == list(next(s for s in SECTIONS if s.name == "rewards").fields)
    assert "(default: 10.0)" in text  # reward_timeout's default
    with pytest.raises(KeyError, match="sections: model, sampling"):
        keys_help("no_such_section")


def test_invalid_yaml_and_non_mapping(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("beta: [1, 2\n")
    with pytest.raises(ConfigError, match=f"^config file {re.escape(str(p))} is not valid YAML: "):
        load_config(p)
    p.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match=f"^config file {re.escape(str(p))} must hold a mapping of key: value$"):
        load_config(p)


def test_reward_weights_must_match_rewards():
    with pytest.raises(ConfigError, match="reward_weights"):
        load_config(None, ["rewards=numeric,format", "reward_weights=1"])


def test_override_without_equals():
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["beta"])


def test_monitor_preset_keeps_its_former_name():
    """clip_gav_probe and seed003 (the name configs written before use) fill the same fields."""
    new, old = Config(monitor_preset="clip_gav_probe", num_iterations=2), Config(monitor_preset="seed003", num_iterations=2)
    assert dataclasses.replace(old, monitor_preset="clip_gav_probe") == new
    assert new.clip_step_band == [0.30, 0.50] and new.fuse_metric == "gav" and new.consistency_steps == 100


def test_rollout_backend_is_read_as_rollout_engine(tmp_path):
    """Configs written with the engine's earlier key keep working: on the command line, in YAML and
    through the Python API's GRPOConfig."""
    from grpo.api import GRPOConfig

    assert load_config(None, ["rollout_backend=hf"]).rollout_engine == "hf"
    path = tmp_path / "c.yaml"
    path.write_text("rollout_backend: fast\n")
    assert load_config(path).rollout_engine == "fast"
    assert GRPOConfig(rollout_backend="hf", output_dir=str(tmp_path / "r")).rollout_engine == "hf"
