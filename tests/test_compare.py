"""`grpo compare` on a tiny model: every method in its own subprocess, the table, JSON and plot."""

import json

import pytest

from grpo.commands.compare import main
from tests.conftest import TEST_BF16


def test_compare_writes_table_json_and_plot(tmp_path, tiny_model_dir, tiny_dataset, capsys):
    out = tmp_path / "cmp"
    code = main(["--methods", "grpo,rloo,ppo", "--steps", "2", "--out", str(out),
                 f"model={tiny_model_dir}", f"task={tiny_dataset}", "num_generations=4", "prompts_per_step=2",
                 "per_device_train_batch_size=4", "max_completion_length=6", "eval_prompts=4",
                 "eval_max_new_tokens=4", "eval_pass_k=0", "report_to=none",
                 "rewards=tests.rewards_for_tests:digit_share", f"bf16={TEST_BF16}"])
    assert code == 0
    data = json.loads((out / "compare.json").read_text())
    assert set(data["methods"]) == {"grpo", "rloo", "ppo"}
    rows = data["methods"]
    for m, row in rows.items():
        assert row["steps"] == 2 and row["peak_rss_mib"] > 0 and row["step_seconds_median"] > 0, (m, row)
        for key in ("accuracy_before", "accuracy_after"):  # a share of the 4 held-out prompts
            assert row[key] * 4 == pytest.approx(round(row[key] * 4)) and 0 <= row[key] <= 1, (m, key, row[key])
        # the same untrained model, the same greedy evaluation: every method starts from one accuracy
        assert row["accuracy_before"] == rows["grpo"]["accuracy_before"], m
        assert row["ratio_to_grpo"]["peak_rss_mib"] == pytest.approx(row["peak_rss_mib"] / rows["grpo"]["peak_rss_mib"])
        # no critic, nothing to diverge
        assert m == "ppo" or row["critic_divergence_events"] == 0, (m, row)
    # PPO's cost, measured where it does not vary from run to run: the state kept for training. GRPO and
    # RLOO differ only in the advantage, so they keep the same (the policy's AdamW moments); PPO
    # adds a value model as large as the policy and its AdamW moments: 2 + 1 + 2 policy-sized tensors
    # against 2, a ratio of about 2.5 (the value head and the optimizers' step counters aside)
    state = {m: row["training_state_mib"] for m, row in rows.items()}
    assert state["rloo"] == state["grpo"] > 0, state
    assert rows["ppo"]["ratio_to_grpo"]["training_state_mib"] == pytest.approx(2.5, abs=0.05), state
    assert "2 policy-gradient steps" in data["header"]
    assert (out / "compare.png").stat().st_size > 1000
    assert "| ppo |" in (out / "compare.md").read_text()
