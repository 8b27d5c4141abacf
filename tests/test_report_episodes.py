"""`grpo report` of a tool run shows whole episodes: every turn of a logged episode (the prompt, the
assistant's call, the tool's result, the answer) from samples.jsonl and eval_completions.jsonl."""

from __future__ import annotations

import html
import json
import re

from grpo.config import Config
from grpo.commands.episodes_html import transcript_html
from grpo.commands.report import build_report
from grpo.train.trainer import Trainer
from tests.conftest import TEST_BF16, TEST_SEED
from tests.test_agent_training import ANSWER, CALL, RESULT, _teach_to_call, calculator_prompt_limit


def test_transcript_html_shows_every_turn_escaped():
    page = transcript_html([{"role": "user", "content": "What is 2 + 3? <b>"},
                            {"role": "assistant", "content": "", "tool_calls": [
                                {"type": "function", "function": {"name": "calc", "arguments": {"expression": "2 + 3"}}}]},
                            {"role": "tool", "name": "calc", "content": "5"}, {"role": "assistant", "content": "5"}])
    turns = re.findall(r"<li[^>]*>(.*?)</li>", page)
    assert len(turns) == 4 and "&lt;b&gt;" in turns[0] and "<b>" not in turns[0].split("</b>", 1)[1]
    assert 'calc({&quot;expression&quot;: &quot;2 + 3&quot;})' in turns[1]
    assert turns[2].startswith("<b>tool</b> (calc): ") and turns[3].endswith("<span>5</span>")


def test_report_of_a_tool_run_shows_a_full_episode(tmp_path, tiny_model_dir):
    cfg = Config(model=str(tmp_path / "caller"), task="calculator", tools="builtin:calculator", max_turns=3,
                 max_prompt_length=calculator_prompt_limit(tiny_model_dir), output_dir=str(tmp_path / "run"),
                 max_steps=1, num_generations=2,
                 prompts_per_step=2, per_device_train_batch_size=4, max_completion_length=48, eval_prompts=2,
                 eval_max_new_tokens=48, eval_pass_k=0, learning_rate=1e-4, progress=False, report_to="none",
                 seed=TEST_SEED, reward_timeout=0.0, bf16=TEST_BF16, rollout_engine="hf", eval_steps=1,
                 log_completions_steps=1)
    _teach_to_call(tiny_model_dir, tmp_path / "caller", cfg)
    Trainer(cfg).train()
    for name in ("samples.jsonl", "eval_completions.jsonl"):  # the logs keep every turn
        rows = [json.loads(x) for x in (tmp_path / "run" / name).read_text().splitlines()]
        roles = [m["role"] for m in rows[0]["transcript"]]
        assert roles[-3:] == ["assistant", "tool", "assistant"], (name, roles)
    page = build_report([tmp_path / "run"]).read_text()
    section = page[page.index("<h2>Episodes"):]
    blocks = re.findall(r"<div class=\"episode-block\"><h3>(.*?)</h3>(.*?)</div>", section, re.S)
    assert {"training sample", "evaluation"} <= {w for head, _ in blocks for w in ("training sample", "evaluation")
                                                 if w in head}
    for _, episode in blocks:  # the call, the tool's result and the answer after it, each a turn
        turns = [html.unescape(t) for t in re.findall(r"<li[^>]*>(.*?)</li>", episode, re.S)]
        calls = [i for i, t in enumerate(turns) if t.startswith("<b>assistant</b>") and CALL in t]
        assert calls, turns  # (the worked exchange before the question calls calc(12 * 34))
        i = calls[-1]
        assert turns[i + 1].startswith("<b>tool</b>") and f"<span>{RESULT}</span>" in turns[i + 1]
        assert turns[i + 2].startswith("<b>assistant</b>") and f"<span>{ANSWER}" in turns[i + 2]
