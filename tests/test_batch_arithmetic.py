"""Batch arithmetic (issue 27; TRL issues #3061, #3443): the micro-batch is derived where one value
always fits, and an impossible split names the values that would work."""

import pytest

from grpo.config import Config, load_config
from grpo.config.validate import derived_micro_batch, divisors
from grpo.errors import ConfigError


@pytest.mark.parametrize("b, g, want", [
    (2, 2, 4),   # B*G = 4: the whole batch (the old default 8 stopped here)
    (4, 8, 8),   # 32: the old default where it fitted
    (5, 2, 5),   # 10: divisors 1, 2, 5, 10 -> 5
    (3, 3, 3),   # 9: 1, 3, 9 -> 3
    (7, 1, 7),   # 7 is prime and below the cap
    (11, 1, 1),  # 11 is prime and above it: only 1 fits
    (3, 4, 6),   # 12: 1, 2, 3, 4, 6, 12 -> 6
])
def test_derived_micro_batch_by_hand(b, g, want):
    assert derived_micro_batch(b, g) == want
    cfg = Config(prompts_per_step=b, num_generations=g, advantage_estimator="reinforce")
    assert cfg.per_device_train_batch_size == want


def test_the_reported_case_runs_and_the_derived_value_is_saved(tmp_path):
    cfg = load_config(None, ["num_generations=2", "prompts_per_step=2"])
    assert cfg.per_device_train_batch_size == 4
    cfg.save(tmp_path / "c.yaml")
    assert load_config(tmp_path / "c.yaml").per_device_train_batch_size == 4


def test_explicit_value_is_kept_and_a_wrong_one_lists_the_divisors():
    assert Config(prompts_per_step=2, num_generations=4, per_device_train_batch_size=2).per_device_train_batch_size == 2
    with pytest.raises(ConfigError) as err:
        load_config(None, ["num_generations=3", "prompts_per_step=2", "per_device_train_batch_size=4"])
    assert str(err.value) == ("per_device_train_batch_size: prompts_per_step * num_generations = 6 is not a "
                              "multiple of 4; use one of [1, 2, 3, 6] (unset: 6)")


def test_mini_batches_error_lists_the_divisors():
    assert divisors(12) == [1, 2, 3, 4, 6, 12] and divisors(0) == []
    with pytest.raises(ConfigError) as err:
        load_config(None, ["prompts_per_step=6", "mini_batches=4"])
    assert str(err.value) == ("mini_batches: 6 prompts per step cannot be split into 4 mini-batches of whole "
                              "groups; use one of [1, 2, 3, 6], or prompts_per_step a multiple of 4")


def test_a_run_with_the_derived_micro_batch(tmp_path, tiny_model_dir, tiny_dataset):
    """B * G = 6, which the old fixed default of 8 refused: the run trains in micro-batches of 6."""
    import json

    import yaml

    from grpo.train.trainer import Trainer
    from tests.test_trainer import make_cfg

    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, per_device_train_batch_size=None, num_generations=3,
                   prompts_per_step=2, max_steps=1, eval_prompts=0)
    t = Trainer(cfg)
    t.train()
    assert yaml.safe_load((t.run_dir / "config.yaml").read_text())["per_device_train_batch_size"] == 6
    line = json.loads((t.run_dir / "metrics.jsonl").read_text())
    assert line["step"] == 1 and line["optimizer_steps"] == 1
