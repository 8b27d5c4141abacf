"""`grpo compare` on a tiny model: every method in its own subprocess, the table, JSON and plot."""

import json

from grpo.compare import main


def test_compare_writes_table_json_and_plot(tmp_path, tiny_model_dir, tiny_dataset, capsys):
    out = tmp_path / "cmp"
    code = main(["--methods", "grpo,rloo,reinforce,ppo", "--steps", "2", "--out", str(out),
                 f"model={tiny_model_dir}", f"task={tiny_dataset}", "num_generations=4", "prompts_per_step=2",
                 "per_device_train_batch_size=4", "max_completion_length=6", "eval_prompts=4",
                 "eval_max_new_tokens=4", "eval_pass_k=0", "report_to=none",
                 "rewards=tests.rewards_for_tests:digit_share"])
    assert code == 0
    data = json.loads((out / "compare.json").read_text())
    assert set(data["methods"]) == {"grpo", "rloo", "reinforce", "ppo"}
    for m, row in data["methods"].items():
        for key in ("peak_rss_mib", "step_seconds_median", "accuracy_before", "accuracy_after",
                    "critic_divergence_events"):
            assert row[key] is not None, (m, key)
        assert row["steps"] == 2
    assert data["methods"]["grpo"]["ratio_to_grpo"]["peak_rss_mib"] == 1.0
    assert "2 policy-gradient steps" in data["header"]
    assert (out / "compare.png").stat().st_size > 1000
    assert "| ppo |" in (out / "compare.md").read_text()
