"""Call formats of the model families, on their published chat templates (tests/fixtures/chat_templates)
with the embedded tokenizer: tools rendered, calls parsed back from the template's own rendering and from
the model's form, results rendered after the calls in the order written; several calls in one turn on the
embedded model; chat_template_kwargs."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from grpo.agent.call_base import Call
from grpo.agent.episodes import USER_MARK, result_turn_ids, run_episodes
from grpo.agent.execute import run_calls
from grpo.agent.formats import CALL_FORMATS, call_format, detect_format
from grpo.agent.sampler import AgentSampler
from grpo.agent.tools import make_tool
from grpo.data.tasks import render_prompt
from grpo.models.loading import set_template_defaults
from grpo.rollout.engine import SamplingSettings
from grpo.rollout.types import Rollout

TEMPLATES = Path(__file__).parent / "fixtures" / "chat_templates"
# template -> (the format auto picks, the format tested, calls per turn its template renders)
FAMILIES = {"qwen2_5": ("hermes", "hermes", 2), "qwen3": ("hermes", "hermes", 2),
            "llama3_1": ("llama3_json", "llama3_json", 1), "llama3_2": ("llama3_json", "llama3_json", 1),
            "llama3_2-pythonic": ("llama3_json", "pythonic", 2), "mistral": ("mistral", "mistral", 2),
            "deepseek_v3": ("deepseek", "deepseek", 2), "deepseek_r1": ("deepseek", "deepseek", 2),
            "gpt_oss": ("harmony", "harmony", 1)}


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: the city, for example Paris
    """
    return f"sunny in {city}"


TOOLS = [make_tool(add), make_tool(weather)]
CALLS = [Call("add", {"a": 2, "b": 3}, "", id="abcdefghi"), Call("weather", {"city": "Paris"}, "", id="bcdefghij")]


@pytest.fixture(scope="module")
def tok():
    from grpo.models.loading import embedded_tokenizer

    return embedded_tokenizer()  # no weights converted for it


def _with(tok, template: str):
    tok.chat_template = (TEMPLATES / f"{template.split('-')[0]}.jinja").read_text()
    return tok


@pytest.mark.parametrize("template", list(FAMILIES))
def test_each_family_round_trips_on_its_published_template(tok, template):
    auto, name, per_turn = FAMILIES[template]
    tok = _with(tok, template)
    assert detect_format(tok) == auto and call_format("auto", tok).name == auto
    fmt = CALL_FORMATS[name]
    # the tools reach the prompt (the template renders them, or the format describes them)
    sampler = AgentSampler(tok, tools=TOOLS, fmt=fmt, max_turns=2, tool_timeout=5.0)
    prompt = sampler._render(sampler.start_messages({"prompt": "What is 2 + 3?"}, TOOLS, "", None), TOOLS)
    assert "weather" in prompt and "The weather in a city" in prompt
    calls = CALLS[:per_turn]
    # the model's form, and the template's own rendering of the calls, parse back to the same calls
    written = _written(name, fmt, calls)
    for text in (written, _rendered_calls(tok, fmt, calls)):
        block = fmt.block(text)
        got = [c for s, e in block.spans for c in fmt.parse_all(text[s:e], {t.name: t for t in TOOLS})]
        assert [(c.name, c.arguments, c.error) for c in got] == [(c.name, c.arguments, None) for c in calls], text
    # the results come after the calls, in their order, as the template renders the whole exchange
    results = ["5", "sunny in Paris"][:per_turn]
    after = tok.decode(result_turn_ids(tok, fmt, calls, results))
    at = [after.find(r) for r in results]
    assert all(a >= 0 for a in at) and at == sorted(at), after
    assert fmt.block(after) is None, after  # it starts after the calls: none of them is in it again


def _written(name: str, fmt, calls: list[Call]) -> str:
    """``calls`` as the model writes them in one turn, in the family's form."""
    if len(calls) == 1:
        return fmt.render_call(calls[0].name, calls[0].arguments)
    if name == "pythonic":
        return '[add(a=2, b=3), weather(city="Paris")]'
    if name == "mistral":
        return ('[TOOL_CALLS][{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "abcdefghi"}, '
                '{"name": "weather", "arguments": {"city": "Paris"}, "id": "bcdefghij"}]')
    if name == "deepseek":  # one list of two calls
        return fmt.render_call("add", {"a": 2, "b": 3})[:-len(fmt.CLOSE)] + \
            fmt.render_call("weather", {"city": "Paris"})[len(fmt.OPEN):]
    return "\n".join(fmt.render_call(c.name, c.arguments) for c in calls)


def _rendered_calls(tok, fmt, calls) -> str:
    """The text after the user's turn where the template renders an assistant message making ``calls``
    (the family's own message, else the calls as the text the model writes)."""
    for msg in (fmt.calls_message(calls), {"role": "assistant", "content": "\n".join(
            fmt.render_call(c.name, c.arguments) for c in calls)}):
        try:
            text = tok.apply_chat_template([{"role": "user", "content": USER_MARK}, msg], tokenize=False)
        except Exception:  # noqa: BLE001  Llama 3.x refuses two calls in one message
            continue
        text = text[text.rfind(USER_MARK) + len(USER_MARK):]
        if fmt.block(text) is not None:
            return text
    raise AssertionError("the template renders no call the format finds")


def test_a_block_ends_where_text_that_starts_no_call_follows():
    fmt = CALL_FORMATS["python"]
    assert fmt.block('add(a=1, b=2)\nweather(city="Rome")').open  # a third call may follow
    assert fmt.block('add(a=1, b=2)\nweath').open  # a call being written
    block = fmt.block('add(a=1, b=2)\n weather(city="Rome")\nThe answer is 3. add(a=5, b=6)')
    assert len(block.spans) == 2 and not block.open
    hermes = CALL_FORMATS["hermes"]
    text = '<tool_call>{"name": "add", "arguments": {}}</tool_call>\n<tool_'
    assert hermes.block(text).open and len(hermes.block(text + "call>").spans) == 1
    assert not hermes.block('<tool_call>{"name": "a"}</tool_call> ok').open


def test_several_calls_run_at_once_and_return_in_the_order_written():
    barrier = threading.Barrier(2, timeout=5)  # passes only when both calls run at the same time
    order = []

    def first(x: str) -> str:
        """First.

        Args:
            x: text
        """
        barrier.wait()
        threading.Event().wait(0.2)  # finishes after the second
        order.append("first")
        return "one"

    def second(x: str) -> str:
        """Second.

        Args:
            x: text
        """
        barrier.wait()
        order.append("second")
        return "two"

    tools = {t.name: t for t in (make_tool(first), make_tool(second))}
    out = run_calls([(Call("first", {"x": "a"}, ""), tools), (Call("second", {"x": "b"}, ""), tools)], timeout=10)
    assert [r.text for r in out] == ["one", "two"] and order == ["second", "first"]


def test_two_calls_in_one_turn_of_the_embedded_model_reach_both_tools(tok):
    """The embedded model, shown an exchange whose call turn makes two calls, writes two in one turn in
    some of 32 sampled episodes; each such turn's results follow it in the order of its calls."""
    from grpo.models import load_models
    from grpo.rollout import make_engine
    from grpo.rollout.keys import row_keys

    models = load_models("embedded:SmolLM2-135M-Instruct", need_reference=False)
    fmt = call_format("auto", models.tokenizer)
    example = {"question": "What is 2 plus 3, and the weather in Rome?",  # a worked turn making two calls
               "calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}, {"name": "weather", "arguments": {"city": "Rome"}}]}
    sampler = AgentSampler(models.tokenizer, tools=TOOLS, fmt=fmt, max_turns=2, tool_timeout=10.0)
    rows = [{"prompt": f"What is {a} plus {b}, and the weather in {c}?", "answer": "", "tool_example": example}
            for a, b, c in ((7, 8, "Paris"), (10, 4, "Oslo"), (1, 9, "Lima"), (6, 6, "Tokyo"))]
    engine = make_engine("fast", models.policy, models.tokenizer, kernels="mkl")
    try:
        ro = sampler.generate(engine, rows, group_size=8, keys=row_keys(1, 1, 0, 32),
                              sampling=SamplingSettings(max_new_tokens=40, temperature=1.0, max_prompt_length=512))
    finally:
        engine.close()
    two = 0
    for info in ro.episodes:
        turn = info["transcript"][4:]  # after the system message and the shown exchange and the question
        calls = fmt.block(turn[0]["content"])
        if calls is None or len(calls.spans) < 2 or turn[0]["content"].count("\n") < 1:
            continue
        written = [fmt.parse(turn[0]["content"][s:e], {t.name: t for t in TOOLS}) for s, e in calls.spans]
        if not all(c.name in ("add", "weather") and c.error is None and c.arguments for c in written):
            continue
        two += 1
        results = [m["content"] for m in turn[1:1 + len(written)]]
        assert all(m["role"] == "tool" for m in turn[1:1 + len(written)])
        for c, r in zip(written, results):  # each tool ran, in the order written
            want = str(add(**c.arguments)) if c.name == "add" and all(isinstance(v, int) for v in c.arguments.values()) \
                else None
            assert r == want if want is not None else (r.startswith("sunny in") or r.startswith("Error"))
    assert two >= 1


def test_episode_tokens_are_the_sampled_ones_where_the_template_re_renders_past_turns(tok):
    """Qwen3's template drops a past assistant turn's <think> text when it renders the conversation
    again (after a later user turn); the episode's tokens keep what was sampled (the loss sees those) and
    only add the result turn."""
    tok = _with(tok, "qwen3")
    fmt = CALL_FORMATS["hermes"]
    turn = '<think>\nadd them\n</think>\n\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    answer = "It is 5."
    scripted = [tok(turn, add_special_tokens=False)["input_ids"] + [tok.eos_token_id],
                tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]]
    engine = _Scripted(tok, scripted)
    sampler = AgentSampler(tok, tools=TOOLS, fmt=fmt, max_turns=3, tool_timeout=5.0)
    (ep,), _ = sampler.episodes([{"prompt": "What is 2 + 3?"}], group_size=1, system_prompt="", max_prompt_length=4096,
                                keys=None)
    run_episodes(engine, [ep], fmt=fmt, sampling=SamplingSettings(512, 1.0, 4096), max_turns=3, tool_timeout=5.0,
                 greedy=True)
    sampled = scripted[0][:-1]  # cut after the call: the end of turn is the template's
    result = result_turn_ids(tok, fmt, [Call("add", {"a": 2, "b": 3}, "")], ["5"])
    # what Qwen3's published template writes after a call and before the next assistant turn, by hand
    assert tok.decode(result) == ("<|im_end|>\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
                                  "<|im_start|>assistant\n")
    assert ep.ids == sampled + result + scripted[1]
    assert ep.trained == [1] * len(sampled) + [0] * len(result) + [1] * len(scripted[1])
    # once the conversation goes on, the template renders that turn without its reasoning; the tokens keep it
    again = tok.apply_chat_template(ep.messages + [{"role": "user", "content": "And 3 + 4?"}], tokenize=False)
    assert "add them" not in again and "add them" in tok.decode(ep.ids)


class _Scripted:
    """A sampler that writes given token ids turn after turn (the episode's assembly is what is tested)."""

    name, supports_stop = "scripted", False

    def __init__(self, tok, turns):
        self.tokenizer, self.turns = tok, list(turns)
        self.model = torch.nn.Linear(1, 1)
        self.model.generation_config = type("G", (), {"eos_token_id": tok.eos_token_id})()

    def generate(self, contexts, **kw):
        ids = torch.tensor([self.turns.pop(0)])  # [1, T]
        return Rollout(torch.tensor([contexts[0]]), torch.ones(1, len(contexts[0]), dtype=torch.long), ids,
                       torch.ones_like(ids), torch.tensor([False]), None, texts=[""], engine="scripted", seconds=0.0)


def test_chat_template_kwargs_reach_the_rendered_prompt_and_the_saved_template(tok, tmp_path):
    tok = _with(tok, "qwen3")
    before = render_prompt(tok, "What is 2 + 3?")
    set_template_defaults(tok, {"enable_thinking": False})
    after = render_prompt(tok, "What is 2 + 3?")
    assert before != after and after.endswith("<think>\n\n</think>\n\n") and after.startswith(before)
    # a caller that passes the variable still decides
    assert tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], tokenize=False,
                                   add_generation_prompt=True, enable_thinking=True) == before
    tok.save_pretrained(tmp_path)  # what the server and an export load
    from transformers import AutoTokenizer

    assert render_prompt(AutoTokenizer.from_pretrained(tmp_path), "What is 2 + 3?") == after


def test_rewards_grade_the_final_channel_of_a_harmony_turn_and_mistral_ids_follow_their_calls():
    harmony = CALL_FORMATS["harmony"]
    raw = "<|channel|>analysis<|message|>2 + 3 is 5<|end|><|start|>assistant<|channel|>final<|message|>It is 5.<|return|>"
    assert harmony.answer_text(raw, "analysis2 + 3 is 5assistantfinalIt is 5.") == "It is 5."
    mistral = CALL_FORMATS["mistral"]
    calls = mistral.parse_all('[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}, '
                              '{"name": "add", "arguments": {"a": 3, "b": 4}, "id": "1"}]', {})
    ids = [c.id for c in calls]  # none written, one not of the template's form: given by position
    assert ids == ["call00000", "call00001"]
    assert [m["tool_call_id"] for c in calls for m in mistral.result_messages(c, "x")] == ids
    assert [t["id"] for t in mistral.calls_message(calls)["tool_calls"]] == ids
