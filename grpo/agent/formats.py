"""Call formats: how tools are shown to the model, how its calls are found and read, how results go back.

A format is an entry of ``CALL_FORMATS`` with one interface (``CallFormat``): render the tools' description
and a worked example exchange into the start of the conversation, find the first complete call in the
text the model generated (its end is where the model's turn is cut), parse it, and render the tool's
result as the messages of the next turn. ``tool_format=auto`` picks ``hermes`` when the tokenizer's chat
template renders tools itself, else ``DEFAULT_FORMAT``.

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
from dataclasses import dataclass
from typing import ClassVar

from grpo.agent.tools import Tool
from grpo.registry import Registry


@dataclass
class Call:
    """One call as the model wrote it: ``error`` says why it could not be read (malformed)."""

    name: str
    arguments: dict | None
    text: str
    error: str | None = None


def supports_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template renders a ``tools`` list (it reads the variable)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(template, str) and re.search(r"\btools\b", template) is not None


class CallFormat:
    """The interface of a call format (see the module docstring)."""

    name: ClassVar[str] = ""
    native: ClassVar[bool] = False  # the chat template renders the tools (apply_chat_template(tools=...))

    def describe(self, tools: list[Tool]) -> str:
        """Text for the system message that tells the model about ``tools`` ('' when the template does)."""
        raise NotImplementedError

    def render_call(self, name: str, arguments: dict) -> str:
        """The call as the model should write it (worked examples)."""
        raise NotImplementedError

    def find_call(self, text: str) -> tuple[int, int] | None:
        """(start, end) character offsets of the first complete call in ``text``, else None."""
        raise NotImplementedError

    def parse(self, text: str, tools: dict[str, Tool]) -> Call:
        """The call ``text`` (a span ``find_call`` found) read into name and arguments."""
        raise NotImplementedError

    def result_messages(self, call: Call, result: str) -> list[dict]:
        """The messages that show ``result`` of ``call`` to the model."""
        raise NotImplementedError

    # which parts of a task's worked exchange the conversation shows, in order (a tuning knob: the
    # untrained model imitates the last assistant turn it saw, see the module docstring)
    example_parts: ClassVar[tuple[str, ...]] = ("question", "call", "result", "answer")

    def example_messages(self, example: dict) -> list[dict]:
        """A worked exchange: {"question", "call": {"name", "arguments"}, "result", "answer"} as
        messages, the parts ``example_parts`` names that the example has (a run-level example has
        no result or answer: grpo.agent.examples)."""
        call = Call(example["call"]["name"], example["call"]["arguments"], "")
        parts = {"question": lambda: [{"role": "user", "content": example["question"]}],
                 "call": lambda: [self.call_message(call.name, call.arguments)],
                 "result": lambda: self.result_messages(call, str(example["result"])),
                 "answer": lambda: [{"role": "assistant", "content": example["answer"]}]}
        return [m for p in self.example_parts if p in example for m in parts[p]()]

    def call_message(self, name: str, arguments: dict) -> dict:
        """The assistant message that makes a call (worked examples)."""
        return {"role": "assistant", "content": self.render_call(name, arguments)}


class HermesFormat(CallFormat):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes, Qwen 2.5 / 3)."""

    name = "hermes"
    native = True
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
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            return Call("", None, text, f"the call is not valid JSON ({e.msg})")
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return Call("", None, text, 'the call must be {"name": ..., "arguments": {...}}')
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return Call(obj["name"], None, text, "the arguments are not a JSON object")
        return Call(obj["name"], args, text)

    def result_messages(self, call: Call, result: str) -> list[dict]:
        return [{"role": "tool", "name": call.name, "content": result}]

    def call_message(self, name: str, arguments: dict) -> dict:
        return {"role": "assistant", "content": "",
                "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}


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
DEFAULT_FORMAT = "python"  # for chat templates without tool support


def call_format(name: str, tokenizer=None) -> CallFormat:
    """The format ``tool_format`` names; ``auto``: hermes where the chat template renders tools, else
    DEFAULT_FORMAT. An unknown name lists the valid ones."""
    if name == "auto":
        return CALL_FORMATS["hermes" if tokenizer is not None and supports_tools(tokenizer) else DEFAULT_FORMAT]
    return CALL_FORMATS.lookup(name, also=("auto",))
