"""The trainer with tools end to end on a tiny Llama: task=calculator tools=builtin:calculator samples
multi-turn episodes, logs the tool metrics per step and in eval.json before and after.

A random tiny model never writes a call, so the test first teaches one to (a few dozen supervised
steps): at the end of a prompt it writes ``calc(2 + 3)``, and after the tool's result it answers
``5``. The run's prompts are cut to their head (the system message with the tool's description) and their
last PROMPT_TOKENS tokens (the end of the user turn and the assistant's header), the same for every
problem, so what it learned on one context is what it meets in the run; the run must then log episodes that call the tool."""

from __future__ import annotations

import json

from grpo.agent import AgentSampler
from grpo.agent.episodes import result_turn_ids
from grpo.agent.formats import Call
from grpo.config import Config
from grpo.data.tasks import calculator_task
from grpo.train.settings import agent_settings
from grpo.train.trainer import Trainer
from tests.conftest import TEST_BF16, TEST_SEED
from tests.teaching import teach

PROMPT_TOKENS = 14  # "?<|im_end|>\n<|im_start|>assistant\n" in the byte-level test tokenizer


def calculator_prompt_limit(model_dir) -> int:
    """A max_prompt_length that keeps of every calculator problem its head (the system message with the
    tool's description, the user turn's header: the same for every problem, kept whole by the cut) and
    its last PROMPT_TOKENS tokens, so every problem's context is the same."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    cfg = Config(task="calculator", tools="builtin:calculator")
    sampler = AgentSampler.from_settings(agent_settings(cfg), tok)
    head, _ = sampler.start_lengths(calculator_task(eval_size=0, seed=0).train[0], cfg.system_prompt)
    return head + PROMPT_TOKENS
CALL, RESULT, ANSWER = "calc(2 + 3)", "5", "5"


def _teach_to_call(model_dir, out, cfg: Config) -> None:
    """Fine-tune the tiny model at ``model_dir`` to call the calculator (the module docstring) on the
    contexts the run's own sampler builds, and save it at ``out``."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    sampler = AgentSampler.from_settings(agent_settings(cfg), tok)
    (ep, other), _ = sampler.episodes(calculator_task(eval_size=0, seed=0).train[:2], group_size=1,
                                      system_prompt=cfg.system_prompt, max_prompt_length=cfg.max_prompt_length,
                                      keys=None)
    assert ep.prompt == other.prompt  # the cut prompts of two problems: one context
    call = tok(CALL, add_special_tokens=False)["input_ids"]
    result = result_turn_ids(tok, sampler.fmt, [Call("calc", {"expression": "2 + 3"}, CALL)], [RESULT])
    answer = tok(ANSWER, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    teach(model_dir, out, [(ep.prompt, call), (ep.prompt + call + result, answer)])  # (context, what follows)


def test_calculator_with_tools_trains_and_logs_tool_metrics(tmp_path, tiny_model_dir):
    cfg = Config(model=str(tmp_path / "caller"), task="calculator", tools="builtin:calculator", max_turns=3,
                 max_prompt_length=calculator_prompt_limit(tiny_model_dir), output_dir=str(tmp_path / "run"),
                 max_steps=2, num_generations=2,
                 prompts_per_step=2, per_device_train_batch_size=4, max_completion_length=48, eval_prompts=2,
                 eval_max_new_tokens=48, eval_pass_k=0, learning_rate=1e-3, progress=False, report_to="none",
                 seed=TEST_SEED, reward_timeout=0.0, bf16=TEST_BF16, rollout_engine="hf")
    _teach_to_call(tiny_model_dir, tmp_path / "caller", cfg)
    result = Trainer(cfg).train()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    for key in ("tools/call_rate", "tools/calls_per_episode", "tools/turns", "tools/errors", "tools/timeouts",
                "tools/max_turns_share"):
        assert all(key in line for line in lines), key
    for line in lines:  # sampled at temperature: nearly every episode calls; a step without a call fails
        assert line["tools/call_rate"] > 0 and line["tools/calls_per_episode"] > 0, line
        assert line["tools/turns"] > 1, line  # a call is answered by a result turn, then the model writes again
    saved = json.loads((tmp_path / "run" / "eval.json").read_text())
    for when in ("before", "after"):
        tools = saved[when]["tools"]
        # greedy: every held-out episode calls once, reads the result and answers (2 turns, no fault)
        assert tools["tools/call_rate"] == 1.0 and tools["tools/calls_per_episode"] == 1.0, (when, tools)
        assert (tools["tools/turns"], tools["tools/errors"], tools["tools/max_turns_share"]) == (2.0, 0, 0.0), tools
        assert result[when]["tools"] == tools
