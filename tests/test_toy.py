"""The seeds' toy (seed 002): its own numbers on its own seed, and GRPO ahead on other seeds."""

import pytest

from grpo.commands.toy import run_seed  # seed 002 on its own seed: tests/test_cli.py::test_toy_prints_table


def test_grpo_beats_baselines_on_other_seeds():
    for seed in (0, 1, 2, 4, 5):
        rates = {r.estimator: r.exact_match for r in run_seed(seed)}
        assert rates["grpo"] >= 0.95, (seed, rates)
        assert rates["grpo"] > rates["reinforce"] and rates["grpo"] > rates["mean_baseline"], (seed, rates)


def test_one_logit_variant_still_ranks_grpo_first():
    rates = {r.estimator: r.exact_match for r in run_seed(0, variant="one_logit")}
    assert rates["grpo"] >= 0.95 and rates["grpo"] > max(rates["reinforce"], rates["mean_baseline"]), rates
    with pytest.raises(ValueError, match="one_logit"):
        run_seed(0, variant="three_logit")
