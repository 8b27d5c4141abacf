"""Call formats: how tools are shown to the model, how its calls are found and read, how results go back.

A format is an entry of ``CALL_FORMATS`` with one interface (``grpo.agent.call_base.CallFormat``). The
families users bring (``grpo.agent.families``): Hermes / Qwen, Llama 3.x JSON, Mistral, DeepSeek,
pythonic lists, gpt-oss harmony; and ``python``, for templates without tool support. A turn may hold
several calls (``CallFormat.block``); they run concurrently and their results return in the order the
model wrote them. ``tool_format=auto`` reads the tokenizer's chat template: the family whose markers it
holds (``CallFormat.markers``), else ``hermes`` when it renders a ``tools`` list, else ``DEFAULT_FORMAT``.

- ``hermes`` (Hermes / Qwen): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; the template
  renders the tools (``apply_chat_template(..., tools=...)``) and results are ``tool`` messages.
- ``python`` (the default for templates without tool support, e.g. SmolLM2's): a call is a line of
  the form ``name(arguments)``, e.g. ``calc(12 * 34)``; the tools are listed in the system message
  and a task's ``tool_example`` is shown as a worked exchange that ENDS on the assistant's call (the
  question, then the call); the result comes back as a ``tool`` message holding the bare value. Why
  (measured on the untrained embedded SmolLM2-135M-Instruct, ``bench/tool_format.py``,
  docs/benchmarks/tool-format.md): a system-prompt description alone drew no calls; an exchange that went on to
  the result and a final answer drew 0-6% (the model imitates the last assistant turn it saw, the
  answer, and computes in its head); the exchange ending on ``calc(12 * 34)`` drew 66% well-formed
  calls, 90% of them with the right expression.
"""

from __future__ import annotations

import ast
import json
import re

from grpo.agent.call_base import Call, CallFormat, arguments_of, json_value, tool_calls_field
from grpo.agent.families import FAMILIES
from grpo.agent.tools import Tool
from grpo.registry import Registry


def supports_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template renders a ``tools`` list (it reads the variable)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(template, str) and re.search(r"\btools\b", template) is not None


class HermesFormat(CallFormat):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes, Qwen 2.5 / 3), one or more per turn."""

    name = "hermes"
    native = True
    markers = ("<tool_call>",)
    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def describe(self, tools: list[Tool]) -> str:
        # used only where the template does not render tools itself (tool_format=hermes chosen by hand)
        listing = "\n".join(json.dumps(t.schema) for t in tools)
        return ("You may call the functions below. To call one, write <tool_call>{\"name\": NAME, "
                f"\"arguments\": {{...}}}}</tool_call>.\n<tools>\n{listing}\n</tools>")

    def render_call(self, name: str, arguments: dict) -> str:
        return f"{self.OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n{self.CLOSE}"

    def find_call(self, text: str) -> tuple[int, int] | None:
        start = text.find(self.OPEN)
        if start < 0:
            return None
        end = text.find(self.CLOSE, start)
        return None if end < 0 else (start, end + len(self.CLOSE))

    def parse(self, text: str, tools: dict[str, Tool]) -> Call:
        body = text[len(self.OPEN):-len(self.CLOSE)].strip()
        obj = json_value(body)
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            why = "the call is not valid JSON" if obj is None else 'the call must be {"name": ..., "arguments": {...}}'
            return Call("", None, text, why)
        return arguments_of(obj["name"], obj.get("arguments", {}), text)

    def calls_message(self, calls: list[Call]) -> dict:
        return {"role": "assistant", "content": "", "tool_calls": tool_calls_field(calls)}


class PythonCallFormat(CallFormat):
    """A call is a line ``name(arguments)``: Python call syntax with literal arguments, or, for a tool
    of one argument, the raw text between the parentheses (``calc(12 * 34)``)."""

    name = "python"
    # SmolLM2's template writes any role as <|im_start|>ROLE; the measured setup sent the bare value as `tool`
    RESULT_ROLE = "tool"
    RESULT_TEXT = "{result}"
    INTRO = ("You can use a tool. To use it, reply with the call and nothing else, for example {example}. "
             "The result is sent back to you; then give the final answer.\nTools:\n{listing}")
    example_parts = ("question", "call")  # the exchange ends on the call (module docstring)
    _START = re.compile(r"(?m)^[ \t]*([A-Za-z_]\w*)\(")
    _OPENING = re.compile(r"[A-Za-z_]\w*(\(.*)?", re.S)  # a call being written: a name, its arguments begun

    def may_open(self, rest: str) -> bool:
        return self._OPENING.fullmatch(rest) is not None or rest == ""

    def describe(self, tools: list[Tool]) -> str:
        lines = []
        for t in tools:
            props = t.parameters.get("properties", {})
            args = ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in props.items())
            lines.append(f"- {t.name}({args}): {t.description}")
        first = tools[0] if tools else None
        example = f"{first.name}(...)" if first else "name(...)"
        return self.INTRO.format(example=example, listing="\n".join(lines))

    def render_call(self, name: str, arguments: dict) -> str:
        if len(arguments) == 1 and isinstance(next(iter(arguments.values())), str):
            return f"{name}({next(iter(arguments.values()))})"  # a one-argument tool: the raw text
        return f"{name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"

    def find_call(self, text: str) -> tuple[int, int] | None:
        m = self._START.search(text)
        if m is None:
            return None
        depth, quote, i = 0, "", m.end() - 1
        while i < len(text):
            c = text[i]
            if quote:
                if c == "\\":
                    i += 1
                elif c == quote:
                    quote = ""
            elif c in "'\"":
                quote = c
            elif c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                if depth == 0:
                    return m.start(1), i + 1
            i += 1
        return None

    def parse(self, text: str, tools: dict[str, Tool]) -> Call:
        name, inner = text[:text.index("(")], text[text.index("(") + 1:-1]
        tool = tools.get(name)
        if tool is None:  # answered as an unknown tool, whatever its arguments
            return Call(name, {}, text)
        params = list(tool.parameters.get("properties", {}))
        try:
            node = ast.parse(f"f({inner})", mode="eval").body
            pos = [ast.literal_eval(a) for a in node.args]
            kw = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
            if len(kw) != len(node.keywords):
                raise ValueError("**kwargs")
        except (SyntaxError, ValueError, TypeError):
            if len(params) == 1:  # a one-argument tool gets the text as written
                return Call(name, {params[0]: inner.strip()}, text)
            return Call(name, None, text, "the arguments must be Python literals, e.g. name(x=1, y=\"a\")")
        if len(pos) > len(params):
            return Call(name, None, text, f"{len(pos)} positional arguments for {len(params)} parameters")
        args = dict(zip(params, pos))
        args.update(kw)
        if len(params) == 1 and not kw and len(pos) == 1 and \
                tool.parameters["properties"][params[0]].get("type") == "string" and not isinstance(pos[0], str):
            args = {params[0]: inner.strip()}  # calc(408): the number as the expression's text
        return Call(name, args, text)

    def result_messages(self, call: Call, result: str) -> list[dict]:
        return [{"role": self.RESULT_ROLE, "content": self.RESULT_TEXT.format(result=result, name=call.name)}]


CALL_FORMATS: Registry[CallFormat] = Registry("call format", field="tool_format")
CALL_FORMATS.register(HermesFormat(), doc=HermesFormat.__doc__)
CALL_FORMATS.register(PythonCallFormat(), doc=PythonCallFormat.__doc__)
for _family in FAMILIES:
    CALL_FORMATS.register(_family(), doc=_family.__doc__)
DEFAULT_FORMAT = "python"  # for chat templates without tool support


def detect_format(tokenizer) -> str:
    """The format a tokenizer's chat template speaks (``tool_format=auto``): the first family whose
    markers the template holds, else ``hermes`` where it renders a ``tools`` list, else DEFAULT_FORMAT."""
    template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    template = template if isinstance(template, str) else ""
    for name, fmt in CALL_FORMATS.items():
        if fmt.markers and all(m in template for m in fmt.markers):
            return name
    return "hermes" if tokenizer is not None and supports_tools(tokenizer) else DEFAULT_FORMAT


def call_format(name: str, tokenizer=None) -> CallFormat:
    """The format ``tool_format`` names; ``auto``: ``detect_format``. An unknown name lists the valid ones."""
    if name == "auto":
        return CALL_FORMATS[detect_format(tokenizer)]
    return CALL_FORMATS.lookup(name, also=("auto",))
