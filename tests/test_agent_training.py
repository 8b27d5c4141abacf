"""The trainer with tools end to end on a tiny random Llama: task=calculator tools=builtin:calculator
samples multi-turn episodes, logs the tool metrics per step and in eval.json before and after."""

from __future__ import annotations

import json

from grpo.config import Config
from grpo.train.trainer import Trainer
from tests.conftest import TEST_BF16, TEST_SEED


def test_calculator_with_tools_trains_and_logs_tool_metrics(tmp_path, tiny_model_dir):
    cfg = Config(model=str(tiny_model_dir), task="calculator", tools="builtin:calculator", max_turns=3,
                 output_dir=str(tmp_path / "run"), max_steps=2, num_generations=2, prompts_per_step=2,
                 per_device_train_batch_size=4, max_completion_length=24, eval_prompts=2, eval_max_new_tokens=16,
                 eval_pass_k=0, learning_rate=1e-3, progress=False, report_to="none", seed=TEST_SEED,
                 reward_timeout=0.0, bf16=TEST_BF16, rollout_backend="hf")
    result = Trainer(cfg).train()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for key in ("tools/call_rate", "tools/calls_per_episode", "tools/turns", "tools/errors", "tools/timeouts",
                "tools/max_turns_share"):
        assert all(key in line for line in lines), key
    assert all(line["tools/turns"] >= 1 for line in lines)
    saved = json.loads((tmp_path / "run" / "eval.json").read_text())
    for when in ("before", "after"):
        assert set(saved[when]["tools"]) >= {"tools/call_rate", "tools/max_turns_share"}
        assert result[when]["tools"] == saved[when]["tools"]
