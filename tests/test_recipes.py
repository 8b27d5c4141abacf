"""recipe=NAME: each published recipe sets its paper's objective where the config holds the default, an
explicit setting wins, an unknown name lists the valid ones; the settings reach the loss; each recipe trains
a step on the tiny model; `grpo train --help recipes` and the configuration reference list them."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpo import GRPOConfig
from grpo.config import Config, load_config
from grpo.config.presets import RECIPES
from grpo.errors import ConfigError
from grpo.train.settings import loss_settings

ROOT = Path(__file__).resolve().parents[1]


def test_each_recipe_sets_its_papers_objective():
    ds = Config(recipe="deepseekmath_grpo")
    assert (ds.advantage_estimator, ds.aggregation, ds.beta, ds.kl_estimator, ds.num_iterations) == (
        "grpo", "seq_mean_token_mean", 0.04, "k3", 1)
    dapo = Config(recipe="dapo", max_completion_length=40)
    assert (dapo.epsilon, dapo.eps_high, dapo.aggregation, dapo.beta, dapo.dynamic_sampling) == (
        0.2, 0.28, "token_mean", 0.0, True)
    assert dapo.overlong_buffer == 8  # the paper's 4096 of 20480: a fifth of the completion length
    dr = Config(recipe="dr_grpo")
    assert (dr.advantage_estimator, dr.aggregation, dr.beta) == ("dr_grpo", "seq_mean_token_sum_norm", 0.0)
    gspo = Config(recipe="gspo")
    assert (gspo.importance_sampling_level, gspo.epsilon, gspo.eps_high, gspo.beta, gspo.mini_batches) == (
        "sequence", 3e-4, 4e-4, 0.0, 4)
    s = loss_settings(gspo)  # what the policy loss is built with
    assert (s.ratio_level, s.eps_low, s.eps_high, s.kl_coef) == ("sequence", 3e-4, 4e-4, 0.0)


def test_an_explicit_setting_wins_and_unknown_names_are_listed():
    c = Config(recipe="dapo", beta=0.01, epsilon_high=0.3, dynamic_sampling=False, overlong_buffer=3)
    assert (c.beta, c.eps_high, c.overlong_buffer, c.aggregation, c.dynamic_sampling) == (0.01, 0.3, 3, "token_mean", False)
    # a value equal to grpo's default, given, wins too: on the command line, in YAML, in GRPOConfig(...)
    assert Config(recipe="dapo", beta=0.04).beta == 0.04
    assert load_config(None, ["recipe=gspo", "epsilon=0.2"]).epsilon == 0.2
    assert GRPOConfig(recipe="dapo", loss_type="grpo").aggregation == "seq_mean_token_mean"
    rebuilt = dataclasses.replace(Config(recipe="dapo", beta=0.04), seed=5)  # every key given: nothing refilled
    assert (rebuilt.beta, rebuilt.eps_high) == (0.04, 0.28)
    with pytest.raises(ConfigError, match=r"^recipe: unknown recipe 'ppo'; valid: none, deepseekmath_grpo, dapo"):
        Config(recipe="ppo")
    assert Config(recipe="none") == Config()
    with pytest.raises(ConfigError, match=r"^mini_batches: 6 prompts per step cannot be split into 4 mini-batches "
                                          r"\(recipe=gspo sets it\)"):
        Config(recipe="gspo", prompts_per_step=6)


@pytest.mark.parametrize("recipe", [r for r in RECIPES if r != "none"])
def test_each_recipe_trains_a_step(recipe, tmp_path, tiny_model_dir, tiny_dataset):
    from grpo.train.trainer import Trainer
    from tests.test_trainer import make_cfg

    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, recipe=recipe, eval_prompts=0, max_steps=1,
                   prompts_per_step=4, dynamic_sampling_rounds=2)
    t = Trainer(cfg)
    t.train()
    lines = [json.loads(x) for x in (t.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1] and math.isfinite(lines[0]["loss"])
    saved = yaml.safe_load((t.run_dir / "config.yaml").read_text())
    assert saved["recipe"] == recipe and saved["aggregation"] == cfg.aggregation  # the resolved values recorded


def test_help_and_the_reference_list_the_recipes_with_their_sources():
    out = subprocess.run([sys.executable, "-m", "grpo", "train", "--help", "recipes"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120).stdout
    for name, source in (("deepseekmath_grpo", "arXiv 2402.03300"), ("dapo", "arXiv 2503.14476"),
                         ("dr_grpo", "arXiv 2503.20783"), ("gspo", "arXiv 2507.18071")):
        assert f"  {name}: " in out and source in out
    page = (ROOT / "docs" / "reference" / "config.md").read_text()
    assert "## Recipes" in page and "| `gspo` | advantage_estimator=grpo" in page
