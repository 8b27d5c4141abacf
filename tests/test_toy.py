"""The seeds' toy: GRPO's group z-score must beat REINFORCE and the mean baseline on every seed."""

from grpo.tools.toy import run_toy


def test_grpo_beats_baselines_on_target_matching():
    for seed in range(5):
        rates = {e: run_toy(e, seed=seed).exact_match for e in ("reinforce", "mean_baseline", "grpo")}
        assert rates["grpo"] >= 0.95, (seed, rates)
        assert rates["grpo"] > rates["reinforce"] and rates["grpo"] > rates["mean_baseline"], (seed, rates)
