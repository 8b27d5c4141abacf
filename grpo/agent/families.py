"""The call formats of the model families users bring, each as its published chat template writes calls
(the templates are test fixtures: tests/fixtures/chat_templates/); ``grpo.agent.formats`` registers
each in ``CALL_FORMATS``.

- ``llama3_json`` (Llama 3.1 / 3.2 / 3.3, JSON tool calling): ``{"name": ..., "parameters": {...}}``,
  optionally after ``<|python_tag|>``; several separated by ``;``.
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}, ...]`` (tokenizer v3), or
  ``[TOOL_CALLS]name[ARGS]{...}`` per call (v11 and later); results carry the call's 9-character id.
- ``deepseek`` (DeepSeek V3 / R1 / V3.1): ``<｜tool▁calls▁begin｜>`` ... one ``<｜tool▁call▁begin｜>`` per
  call ... ``<｜tool▁calls▁end｜>``.
- ``pythonic`` (Llama 3.2 / Llama 4 pythonic): one list of calls, ``[calc(expression="2+3"), ...]``.
- ``harmony`` (gpt-oss): ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>``.
"""

from __future__ import annotations

import ast
import json
import re

from grpo.agent.call_base import (Block, Call, CallFormat, arguments_of, example_call_id, json_object_end,
                                  json_value, tool_calls_field)
from grpo.agent.tools import Tool


def _listing(tools: list[Tool]) -> str:
    return "\n".join(json.dumps(t.schema) for t in tools)


class Llama3JsonFormat(CallFormat):
    """``{"name": ..., "parameters": {...}}`` (Llama 3.x JSON tool calling), after an optional
    ``<|python_tag|>``; several calls separated by ``;``. Results are ``tool`` messages (``ipython``)."""

    name = "llama3_json"
    native = True
    special_tokens = True
    markers = ("respond with a JSON for a function call",)
    separator = ";"
    TAG = "<|python_tag|>"

    def describe(self, tools: list[Tool]) -> str:
        return ('To call a function, respond with JSON {"name": function name, "parameters": {argument: value}}.'
                f"\n{_listing(tools)}")

    def render_call(self, name: str, arguments: dict) -> str:
        return json.dumps({"name": name, "parameters": arguments})

    def openers(self) -> tuple[str, ...]:
        return (self.TAG, "{")

    def find_call(self, text: str) -> tuple[int, int] | None:
        for m in re.finditer(r"\{", text):
            end = json_object_end(text, m.start())
            if end is None:
                return None  # an object that has not closed yet: a call may be in progress
            obj = json_value(text[m.start():end])
            if isinstance(obj, dict) and isinstance(obj.get("name"), str) and ("parameters" in obj or "arguments" in obj):
                start = m.start()
                before = text[:start].rstrip()
                return (len(before) - len(self.TAG), end) if before.endswith(self.TAG) else (start, end)
        return None

    def parse(self, text: str, tools: dict[str, Tool]) -> Call:
        obj = json_value(text.removeprefix(self.TAG).strip()) or {}
        return arguments_of(obj.get("name", ""), obj.get("parameters", obj.get("arguments")), text)

    def calls_message(self, calls: list[Call]) -> dict:
        return {"role": "assistant", "content": "", "tool_calls": tool_calls_field(calls)}


class MistralFormat(CallFormat):
    """``[TOOL_CALLS]`` then a JSON list of ``{"name", "arguments", "id"}`` (tokenizer v3), or
    ``[TOOL_CALLS]name[ARGS]{...}`` per call (v11 and later). Each result is a ``tool`` message with the
    call's id (the template requires 9 letters and digits; a call written without one is given one)."""

    name = "mistral"
    native = True
    special_tokens = True
    markers = ("[TOOL_CALLS]",)
    OPEN, ARGS = "[TOOL_CALLS]", "[ARGS]"

    def describe(self, tools: list[Tool]) -> str:
        return f"[AVAILABLE_TOOLS]{json.dumps([t.schema for t in tools])}[/AVAILABLE_TOOLS]"

    def render_call(self, name: str, arguments: dict) -> str:
        return f"{self.OPEN}{json.dumps([{'name': name, 'arguments': arguments}])}"

    def find_call(self, text: str) -> tuple[int, int] | None:
        start = text.find(self.OPEN)
        if start < 0:
            return None
        body = start + len(self.OPEN)
        rest = text[body:]
        lead = len(rest) - len(rest.lstrip())
        if rest[lead:lead + 1] == "[":  # v3: a JSON list
            end = json_object_end(text, body + lead)
            return None if end is None else (start, end)
        m = re.match(r"\s*[\w.\-]+\[ARGS\]", rest)  # v11: name[ARGS]{...}
        if m is None:
            return None
        end = json_object_end(text, body + m.end()) if text[body + m.end():body + m.end() + 1] == "{" else None
        return None if end is None else (start, end)

    def parse(self, text: str, tools: dict[str, Tool]) -> Call:
        return self.parse_all(text, tools)[0]

    def parse_all(self, text: str, tools: dict[str, Tool]) -> list[Call]:
        body = text[len(self.OPEN):].strip()
        if self.ARGS in body and not body.startswith("["):
            name, _, args = body.partition(self.ARGS)
            return [arguments_of(name.strip(), json_value(args), text)]
        items = json_value(body)
        if not isinstance(items, list) or not items:
            return [Call("", None, text, "the calls are not a JSON list of {\"name\", \"arguments\"}")]
        # the template requires ids of 9 letters and digits: one the model did not write (or wrote otherwise)
        # is given by position, the same in the calls' and the results' rendering
        return [arguments_of(it.get("name", ""), it.get("arguments"), text, _mistral_id(it.get("id"), i))
                if isinstance(it, dict) else Call("", None, text, "a call is not a JSON object")
                for i, it in enumerate(items)]

    def result_messages(self, call: Call, result: str) -> list[dict]:
        return [{"role": "tool", "name": call.name, "content": result, "tool_call_id": call.id or example_call_id(0)}]

    def calls_message(self, calls: list[Call]) -> dict:
        return {"role": "assistant", "content": "", "tool_calls": tool_calls_field(calls)}


def _mistral_id(given, i: int) -> str:
    """The call's id as the model wrote it where it is 9 letters and digits, else one by position."""
    return given if isinstance(given, str) and len(given) == 9 and given.isalnum() else example_call_id(i)


class DeepSeekFormat(CallFormat):
    """``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>
    ...<｜tool▁calls▁end｜>`` (DeepSeek V3 / R1); V3.1 writes ``NAME<｜tool▁sep｜>{...}`` in each call."""

    name = "deepseek"
    native = True
    special_tokens = True
    markers = ("tool▁calls▁begin",)
    OPEN, CLOSE = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
    CALL = re.compile(r"<｜tool▁call▁begin｜>(.*?)<｜tool▁sep｜>(.*?)<｜tool▁call▁end｜>", re.S)

    def describe(self, tools: list[Tool]) -> str:
        return f"## Tools\nYou have access to the following tools:\n{_listing(tools)}"

    def render_call(self, name: str, arguments: dict) -> str:
        return (f"{self.OPEN}<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{json.dumps(arguments)}\n```"
                f"<｜tool▁call▁end｜>{self.CLOSE}")

    def find_call(self, text: str) -> tuple[int, int] | None:
        start = text.find(self.OPEN)
        end = text.find(self.CLOSE, start) if start >= 0 else -1
        return None if end < 0 else (start, end + len(self.CLOSE))

    def parse(self, text: str, tools: dict[str, Tool]) -> Call:
        return self.parse_all(text, tools)[0]

    def parse_all(self, text: str, tools: dict[str, Tool]) -> list[Call]:
        calls = []
        for kind, rest in self.CALL.findall(text):
            if kind.strip() == "function":  # V3: the name on the first line, the arguments in a json fence
                name, _, args = rest.partition("\n")
                args = re.sub(r"^\s*```(?:json)?\s*|\s*```\s*$", "", args)
            else:  # V3.1: NAME<｜tool▁sep｜>{...}
                name, args = kind, rest
            calls.append(arguments_of(name.strip(), json_value(args.strip()), text))
        return calls or [Call("", None, text, "no <｜tool▁call▁begin｜>...<｜tool▁call▁end｜> in the calls")]

    def calls_message(self, calls: list[Call]) -> dict:
        return {"role": "assistant", "content": "", "tool_calls": tool_calls_field(calls, arguments_as_text=True)}


class PythonicFormat(CallFormat):
    """One Python list of calls with keyword arguments, ``[calc(expression="2+3"), lookup(city="Paris")]``
    (Llama 3.2 / Llama 4 pythonic tool calling), optionally inside ``<|python_start|>...<|python_end|>``."""

    name = "pythonic"
    native = True
    special_tokens = True
    markers = ("[func_name1(",)
    _START = re.compile(r"\[\s*[A-Za-z_][\w.]*\(")

    def describe(self, tools: list[Tool]) -> str:
        return ("To call functions, respond with a Python list of calls, "
                f"[func_name1(param=value), func_name2(param=value)], and nothing else.\n{_listing(tools)}")

    def render_call(self, name: str, arguments: dict) -> str:
        return f"[{self._one(name, arguments)}]"

    @staticmethod
    def _one(name: str, arguments: dict) -> str:
        return f"{name}({', '.join(f'{k}={json.dumps(v)}' for k, v in arguments.items())})"

    def openers(self) -> tuple[str, ...]:
        return ("<|python_start|>", "[")

    def find_call(self, text: str) -> tuple[int, int] | None:
        m = self._START.search(text)
        if m is None:
            return None
        end = json_object_end(text, m.start())  # brackets and double-quoted strings balance as in JSON
        if end is None:
            return None
        start = m.start() - len("<|python_start|>") if text[:m.start()].endswith("<|python_start|>") else m.start()
        close = text.find("<|python_end|>", end)
        return (start, close + len("<|python_end|>")) if close == end else (start, end)

    def parse(self, text: str, tools: dict[str, Tool]) -> Call:
        return self.parse_all(text, tools)[0]

    def parse_all(self, text: str, tools: dict[str, Tool]) -> list[Call]:
        body = text.removeprefix("<|python_start|>").removesuffix("<|python_end|>").strip()
        try:
            node = ast.parse(body, mode="eval").body
            if not isinstance(node, ast.List) or not node.elts:
                raise ValueError("not a list")
            calls = []
            for c in node.elts:
                if not isinstance(c, ast.Call) or c.args:
                    raise ValueError("each item must be name(param=value, ...)")
                name = ast.unparse(c.func)
                kwargs = {k.arg: _literal(k.value) for k in c.keywords}
                calls.append(Call(name, kwargs, text))
            return calls
        except (SyntaxError, ValueError, TypeError) as e:
            return [Call("", None, text, f"the calls must be [name(param=value), ...] ({e})")]

    def calls_message(self, calls: list[Call]) -> dict:
        return {"role": "assistant", "content": "", "tool_calls": tool_calls_field(calls)}


def _literal(node):
    """A keyword argument's value: a Python literal, or JSON's true / false / null."""
    if isinstance(node, ast.Name) and node.id in ("true", "false", "null"):
        return {"true": True, "false": False, "null": None}[node.id]
    return ast.literal_eval(node)


class HarmonyFormat(CallFormat):
    """gpt-oss's harmony format: a message on the commentary channel addressed to ``functions.NAME``,
    ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`` (one call per
    message; ``<|call|>`` ends the model's turn). Results are ``tool`` messages, rendered as
    ``<|start|>functions.NAME to=assistant<|channel|>commentary<|message|>...<|end|>``."""

    name = "harmony"
    native = True
    special_tokens = True
    markers = ("<|call|>",)
    CALL = re.compile(r"to=functions\.([\w.\-]+)((?:(?!<\|message\|>).)*)<\|message\|>(.*?)<\|call\|>", re.S)

    def describe(self, tools: list[Tool]) -> str:
        return f"# Tools\n\n## functions\n\n{_listing(tools)}"

    def render_call(self, name: str, arguments: dict) -> str:
        return f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{json.dumps(arguments)}<|call|>"

    def find_call(self, text: str) -> tuple[int, int] | None:
        m = self.CALL.search(text)
        if m is None:
            return None
        head = text.rfind("<|channel|>", 0, m.start())
        start = head if head >= 0 and "<|message|>" not in text[head:m.start()] else m.start()
        return start, m.end()

    def block(self, text: str) -> Block | None:
        span = self.find_call(text)  # <|call|> ends the model's turn: one call per turn
        return None if span is None else Block([span], open=False)

    def parse(self, text: str, tools: dict[str, Tool]) -> Call:
        m = self.CALL.search(text)
        return arguments_of(m.group(1), json_value(m.group(3).strip()), text)

    def answer_text(self, raw: str, plain: str) -> str:
        """The final channel's message (the analysis channel is the model's reasoning, not its answer)."""
        m = re.search(r"<\|channel\|>final<\|message\|>(.*?)(?:<\|return\|>|<\|end\|>|$)", raw, re.S)
        return m.group(1).strip() if m else plain

    def calls_message(self, calls: list[Call]) -> dict:
        return {"role": "assistant", "content": "", "tool_calls": tool_calls_field(calls)}


FAMILIES = (Llama3JsonFormat, MistralFormat, DeepSeekFormat, PythonicFormat, HarmonyFormat)
