"""Multi-turn episodes with tools (grpo.agent): a scripted model (an engine that replays fixed texts as
tokens, answering each context by what it holds) drives one and several calls and every fault; the
result turn's tokens are in the context and out of the loss; a TRL-form environment runs unchanged.

Dimension letters: N sequences, T completion tokens.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from grpo.agent import AgentSampler, call_format, make_tool, resolve_tools
from grpo.agent.execute import run_calls
from grpo.agent.formats import Call
from grpo.errors import ConfigError
from grpo.rollout.types import encode_prompts, finish_rollout, eos_token_ids
from grpo.rollout.engine import RolloutEngine, SamplingSettings
from tests.conftest import build_tiny_model, build_tokenizer


class ScriptedEngine(RolloutEngine):
    """A real RolloutEngine whose 'model' answers each context with ``reply(context_text)`` (+ EOS):
    token ids in, token ids out, through the same encode/finish path as the real engines."""

    name = "scripted"

    def __init__(self, model, tokenizer, reply):
        super().__init__(model, tokenizer)
        self.reply, self.contexts = reply, []

    def _generate(self, prompts, *, group_size, sampling, keys, with_logprobs, greedy):
        ids, mask, _ = encode_prompts(self.tokenizer, prompts, sampling.max_prompt_length)
        texts = [self.tokenizer.decode(r[m.bool()]) for r, m in zip(ids, mask)]
        self.contexts += texts
        outs = [self.tokenizer(self.reply(t), add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
                for t in texts for _ in range(group_size)]
        width = max(len(o) for o in outs)
        comp = torch.full((len(outs), width), self.tokenizer.pad_token_id)  # [N, T]
        for i, o in enumerate(outs):
            comp[i, :len(o)] = torch.tensor(o)
        comp = comp[:, :sampling.max_new_tokens]
        return finish_rollout(self.tokenizer, ids.repeat_interleave(group_size, 0), mask.repeat_interleave(group_size, 0),
                              comp, eos_token_ids(self.model, self.tokenizer), sampling_logp=None,
                              engine=self.name, seconds=0.0)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    m = build_tiny_model(len(tok), seed=0, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    m.generation_config.eos_token_id = tok.eos_token_id
    return m


def _sampler(tok, tools="builtin:calculator", *, max_turns=4, timeout=5.0, factory=None, fmt="python"):
    return AgentSampler(tok, tools=resolve_tools(tools) if isinstance(tools, str) else tools, factory=factory,
                        fmt=call_format(fmt, tok), max_turns=max_turns, tool_timeout=timeout)


TOOL_TURN = "<|im_start|>tool\n"  # how the python format's results reach SmolLM2's template


def _last_result(text: str) -> str | None:
    """The last tool result in a rendered context, None before the first."""
    return text.rsplit(TOOL_TURN, 1)[-1].split("<|im_end|>")[0] if TOOL_TURN in text else None


SAMPLE = {"prompt": "What is 123 * 45?", "answer": "5535"}
SAMPLING = SamplingSettings(max_new_tokens=1000, max_prompt_length=4000, temperature=1.0)


def test_one_call_then_the_answer_and_the_masks(tok, model):
    def reply(ctx):
        last = _last_result(ctx)
        return "calc(123 * 45) and more text" if last is None else f"123 * 45 = {last}"

    eng = ScriptedEngine(model, tok, reply)
    ro = _sampler(tok).generate(eng, [SAMPLE], group_size=2, sampling=SAMPLING)
    ro.check()
    assert ro.texts == ["123 * 45 = 5535"] * 2
    info = ro.episodes[0]
    assert (info["turns"], info["tool_calls"], info["well_formed_calls"], info["tool_errors"]) == (2, 1, 1, 0)
    assert [m["role"] for m in info["transcript"][-3:]] == ["assistant", "tool", "assistant"]
    assert info["transcript"][-3]["content"] == "calc(123 * 45)"  # cut right after the call
    # the second turn's context is exactly the prompt + the completion's first part, as token ids
    row = ro.completion_ids[0][ro.completion_mask[0].bool()].tolist()
    first = tok("calc(123 * 45)", add_special_tokens=False)["input_ids"]
    assert row[:len(first)] == first and ro.loss_mask[0, :len(first)].all()
    result_ids = tok("<|im_end|>\n<|im_start|>tool\n5535<|im_end|>\n<|im_start|>assistant\n",
                     add_special_tokens=False)["input_ids"]
    hole = ro.loss_mask[0, len(first):len(first) + len(result_ids)]
    assert row[len(first):len(first) + len(result_ids)] == result_ids and not hole.any()
    assert ro.loss_mask[0, len(first) + len(result_ids):].sum() == len(row) - len(first) - len(result_ids)
    assert int(ro.loss_mask[0].sum()) == len(row) - len(result_ids)


def test_several_calls_and_each_fault_is_answered_and_counted(tok, model):
    def slow(seconds: float) -> str:
        """Sleep.

        Args:
            seconds: how long
        """
        time.sleep(seconds)
        return "woke"

    def boom(x: int) -> str:
        """Raise.

        Args:
            x: anything
        """
        raise RuntimeError("kaput")

    script = ["calc(2 + 3)", "nosuch(1)", "boom(x=1, y=2)", "boom(x='a')", "boom(1)", "slow(3)",
              "calc(1 +* 2)", "calc(2 ** 3)", "done"]

    def reply(ctx):
        return script[ctx.count(TOOL_TURN)]

    tools = resolve_tools("builtin:calculator") + [make_tool(slow), make_tool(boom)]
    eng = ScriptedEngine(model, tok, reply)
    ro = _sampler(tok, tools, max_turns=20, timeout=0.3).generate(eng, [SAMPLE], group_size=1, sampling=SamplingSettings(
        max_new_tokens=2000, max_prompt_length=2000, temperature=1.0))
    info = ro.episodes[0]
    results = [m["content"] for m in info["transcript"] if m["role"] == "tool"]
    assert results[0] == "5" and results[-1] == "8"
    assert "unknown tool 'nosuch'" in results[1] and "unknown argument(s) y" in results[2]
    assert "must be of type integer" in results[3] and "raised RuntimeError: kaput" in results[4]
    assert "longer than 0.3 s" in results[5] and "calc raised ValueError" in results[6]
    assert (info["tool_calls"], info["tool_errors"], info["tool_timeouts"], info["turns"]) == (8, 6, 1, 9)
    assert info["well_formed_calls"] == 5  # the calls that ran: calc x3, boom(1), slow(3)
    assert ro.texts == ["done"] and not info["max_turns_hit"]


def test_malformed_hermes_call_and_max_turns_flag(tok, model):
    eng = ScriptedEngine(model, tok, lambda ctx: '<tool_call>{"name": "calc", "arguments": {"expression": "1+1"}}'
                         '</tool_call>' if ctx.count("<|im_start|>tool") % 2 else '<tool_call>{not json</tool_call>')
    ro = _sampler(tok, max_turns=3, fmt="hermes").generate(eng, [SAMPLE], group_size=1, sampling=SAMPLING)
    info = ro.episodes[0]
    tool_msgs = [m["content"] for m in info["transcript"] if m["role"] == "tool"]
    assert tool_msgs[0].startswith("Error: malformed call") and tool_msgs[1] == "2"
    assert info["max_turns_hit"] and info["turns"] == 3 and info["tool_calls"] == 3 and len(tool_msgs) == 2
    assert bool(ro.truncated[0])


def test_the_budget_counts_tool_tokens(tok, model):
    eng = ScriptedEngine(model, tok, lambda ctx: "calc(1 + 1)")
    ro = _sampler(tok, max_turns=50).generate(eng, [SAMPLE], group_size=1,
                                              sampling=SamplingSettings(max_new_tokens=120, max_prompt_length=2000, temperature=1.0))
    assert int(ro.completion_mask.sum()) <= 120 and bool(ro.truncated[0])
    assert not ro.episodes[0]["max_turns_hit"]


def test_async_tools_run_concurrently_with_a_deadline():
    running, most = [0], [0]

    async def wait(seconds: float) -> str:
        """Wait.

        Args:
            seconds: how long
        """
        running[0] += 1
        most[0] = max(most[0], running[0])
        try:
            await asyncio.sleep(seconds)
        finally:
            running[0] -= 1
        return "ok"

    tool = make_tool(wait)
    assert tool.is_async
    jobs = [(Call("wait", {"seconds": 0.2}, ""), {"wait": tool}) for _ in range(8)] + \
        [(Call("wait", {"seconds": 5.0}, ""), {"wait": tool})]
    out = run_calls(jobs, timeout=1.0)
    assert [r.text for r in out[:8]] == ["ok"] * 8 and out[8].timeout and out[8].error
    assert most[0] > 1  # the calls overlapped
    assert running[0] == 0  # the 5 s call was cancelled at its deadline, not left running


class Counter:
    """A TRL environment_factory class, written for TRL: reset(**kwargs), public tool methods, get_reward."""

    def reset(self, **kwargs) -> str:
        self.target, self.value = int(kwargs["answer"]), 0
        return f" Reach {self.target}."

    def add(self, amount: int) -> str:
        """Add to the counter.

        Args:
            amount: how much to add
        """
        self.value += amount
        return str(self.value)

    def get_reward(self) -> float:
        return float(self.value == self.target)

    def _private(self) -> None:
        raise AssertionError("not a tool")


def test_a_trl_environment_class_runs_unchanged(tok, model):
    def reply(ctx):
        assert ("Reach 7." in ctx or "Reach 6." in ctx) and "add(amount: integer)" in ctx and "_private" not in ctx
        n = ctx.count(TOOL_TURN)
        return ["add(3)", "add(amount=4)", "reached"][n]

    eng = ScriptedEngine(model, tok, reply)
    sampler = _sampler(tok, [], factory=Counter)
    ro = sampler.generate(eng, [{"prompt": "Count.", "answer": "7"}, {"prompt": "Count.", "answer": "6"}],
                          group_size=2, sampling=SAMPLING)
    assert [e["environment_reward"] for e in ro.episodes] == [1.0, 1.0, 0.0, 0.0]
    assert ro.episodes[0]["tool_calls"] == 2 and ro.episodes[0]["tool_errors"] == 0
    from grpo.rewards.builtin import REWARDS
    assert REWARDS["environment"]("reached", {**ro.episodes[0]}) == 1.0
    assert sampler.last_metrics["tools/call_rate"] == 1.0


def test_an_unknown_builtin_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="builtin:calculator"):
        resolve_tools("builtin:abacus")


@pytest.mark.parametrize("expr,want", [("12 * 34", "408"), ("(2 + 3) ** 2 / 5", "5"), ("7 / 2", "3.5"),
                                       ("-3 ** 2", "-9"), ("  123*45 ", "5535"), ("2 ^ 10", "1024"),
                                       ("1.5 * 4", "6"), ("((1))", "1")])
def test_calculator_by_hand(expr, want):
    from grpo.agent import calc
    assert calc(expr) == want


@pytest.mark.parametrize("hostile", ["__import__('os').system('true')", "9 ** 9 ** 9", "2 ** 100000", "1 / 0",
                                     "x + 1", "(-8) ** 0.5", "1" * 300, "10 ** 200 * 10 ** 200", "1e308 * 10",
                                     "[1] * 3", "'a' * 3", "0 ** -1", "abs(-1)", "1 if 1 else 2", "+".join(["1"] * 90),
                                     "(1).__class__", "1e200 ** 2", "", "lambda: 1"])
def test_calculator_refuses_hostile_input(hostile):
    from grpo.agent import calc
    with pytest.raises(ValueError):
        calc(hostile)


def test_engines_take_token_id_prompts_as_they_are(tok):
    text = "<|im_start|>user\nhi<|im_end|>\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    by_text, _, _ = encode_prompts(tok, [text, "ab"], 100)
    mixed, mask, cut = encode_prompts(tok, [ids, [5, 6, 7]], 100)
    assert torch.equal(by_text[0], mixed[0]) and mixed[1, -3:].tolist() == [5, 6, 7] and mask[1].sum() == 3
    _, _, cut = encode_prompts(tok, [ids], 4)
    assert cut == 1


class Guess:
    """An environment whose reset takes one named field (not **kwargs)."""

    def reset(self, answer: str) -> None:
        self.answer, self.hit = answer, False

    def guess(self, number: int) -> str:
        """Guess the answer.

        Args:
            number: the guess
        """
        self.hit = str(number) == self.answer
        return "yes" if self.hit else "no"

    async def get_reward(self) -> float:
        return float(self.hit)


def test_reset_gets_the_fields_its_signature_names_and_an_async_reward(tok, model):
    eng = ScriptedEngine(model, tok, lambda ctx: "guess(5535)" if TOOL_TURN not in ctx else "ok")
    ro = _sampler(tok, [], factory=Guess).generate(eng, [SAMPLE, {**SAMPLE, "answer": "1"}], group_size=1,
                                                   sampling=SAMPLING)
    assert [e["environment_reward"] for e in ro.episodes] == [1.0, 0.0]


def test_auto_format_is_hermes_where_the_template_renders_tools(tok):
    from grpo.agent import DEFAULT_FORMAT
    assert call_format("auto", tok).name == DEFAULT_FORMAT  # the test template has no tools
    other = build_tokenizer()
    other.chat_template = "{% if tools %}{{ tools | tojson }}{% endif %}" + other.chat_template
    assert call_format("auto", other).name == "hermes"
    with pytest.raises(ValueError, match="valid: auto, hermes, python"):
        call_format("nope")


def test_task_calculator_fills_what_its_episodes_need_unless_given():
    from grpo.config import Config

    cfg = Config(task="calculator")
    assert (cfg.tools, cfg.max_completion_length, cfg.eval_max_new_tokens) == ("builtin:calculator", 64, 64)
    assert Config(task="calculator", max_completion_length=48).max_completion_length == 48  # explicit wins
    assert (Config().tools, Config().max_completion_length) == ("", 32)  # other tasks keep the defaults
