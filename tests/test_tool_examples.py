"""Tools on any dataset: the worked exchange (a question, then the assistant's call) built from a call
given once in the config or from the tool's own schema, shown where a row has no tool_example."""

from __future__ import annotations

import pytest

from grpo.agent import AgentSampler
from grpo.agent.examples import example_value, worked_example
from grpo.agent.tools import resolve_tools
from grpo.config import Config
from grpo.errors import ConfigError
from grpo.train.settings import agent_settings
from tests.conftest import build_tokenizer

LOOKUP = "tests.tools_for_tests:lookup_population"


def test_a_call_from_the_schema_takes_the_docstrings_example_else_a_placeholder():
    assert worked_example(resolve_tools(LOOKUP)) == {
        "question": "Look up how many people live in a city: Paris",
        "call": {"name": "lookup_population", "arguments": {"city": "Paris"}}}
    call = worked_example(resolve_tools("tests.tools_for_tests:convert"))["call"]
    assert call["arguments"] == {"amount": 1.5, "unit": "text", "exact": True}  # placeholders by JSON type
    assert example_value({"type": "integer", "description": "How many, e.g. 12."}) == 12
    assert example_value({"type": "string", "enum": ["km", "mi"]}) == "km"


def test_a_call_given_once_is_read_against_the_schema():
    tools = resolve_tools(f"{LOOKUP},builtin:calculator")
    got = worked_example(tools, call='lookup_population(city="Lyon")', question="How many people live in Lyon?")
    assert got == {"question": "How many people live in Lyon?",
                   "call": {"name": "lookup_population", "arguments": {"city": "Lyon"}}}
    assert worked_example(tools, call="calc(3 + 4)")["call"]["arguments"] == {"expression": "3 + 4"}
    assert worked_example(tools, call="none") is None
    for bad, why in (("find(city='Lyon')", "no tool named 'find'"), ("just text", "no call NAME"),
                     ("calc(1, 2)", "2 positional arguments for 1 parameters")):
        with pytest.raises(ConfigError, match=rf"^tool_example_call: .* is not a call of one of the tools .*{why}"):
            worked_example(tools, call=bad)


def _start(cfg_kw: dict, sample: dict) -> list[dict]:
    tok = build_tokenizer()
    agent = AgentSampler.from_settings(agent_settings(Config(tools=LOOKUP, **cfg_kw)), tok)
    return agent.start_messages(sample, agent.tools, "", None)


def test_a_row_without_tool_example_gets_the_runs_exchange_ending_on_the_call():
    row = {"prompt": "How many people live in Nice?", "answer": "342669"}
    msgs = _start({"tool_example_call": 'lookup_population(city="Lyon")'}, row)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[2]["content"] == "lookup_population(Lyon)"  # the python format: one text argument, raw
    assert msgs[1]["content"] == "Look up how many people live in a city: Lyon" and msgs[3]["content"] == row["prompt"]
    # the row's own example wins; none shows no exchange
    own = {"question": "q?", "call": {"name": "lookup_population", "arguments": {"city": "Lille"}}, "result": "1",
           "answer": "1"}
    assert _start({}, {**row, "tool_example": own})[2]["content"] == "lookup_population(Lille)"
    assert [m["role"] for m in _start({"tool_example_call": "none"}, row)] == ["system", "user"]
    # hermes shows the call as a tool_calls message
    hermes = _start({"tool_format": "hermes"}, row)
    assert hermes[2]["tool_calls"][0]["function"] == {"name": "lookup_population", "arguments": {"city": "Paris"}}


def test_a_bad_call_is_an_error_before_any_sampling():
    with pytest.raises(ConfigError, match="tool_example_call"):
        AgentSampler.from_settings(agent_settings(Config(tools=LOOKUP, tool_example_call="lookup(x)")), build_tokenizer())
