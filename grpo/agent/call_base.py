"""The interface of a call format, and the text scanning the formats share.

A format (``CallFormat``) says how tools are shown to the model, how its calls are found in the text it
wrote and read, and how results go back. A model may write several calls in one turn: the **block** of a
turn is the run of call units that follow each other with only blank text (or the format's separator)
between them, starting at the first unit (``CallFormat.block``). A unit is one call (``<tool_call>...``)
or, for the families that write a list (Mistral's ``[TOOL_CALLS][...]``, pythonic ``[f(), g()]``,
DeepSeek's ``<｜tool▁calls▁begin｜>...``), the whole list; ``parse_all`` reads a unit into its calls, in
the order the model wrote them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import ClassVar

from grpo.agent.tools import Tool


@dataclass
class Call:
    """One call as the model wrote it: ``error`` says why it could not be read (malformed); ``id`` is the
    call's id where the family gives calls ids (Mistral), '' otherwise."""

    name: str
    arguments: dict | None
    text: str
    error: str | None = None
    id: str = ""


@dataclass(frozen=True)
class Block:
    """The calls of one model turn: ``spans`` the (start, end) character offsets of each unit, in order;
    ``open`` whether the text after the last unit may still become another unit (the turn may go on)."""

    spans: list[tuple[int, int]] = field(default_factory=list)
    open: bool = True

    @property
    def end(self) -> int:
        return self.spans[-1][1]


def json_object_end(text: str, start: int) -> int | None:
    """The offset just past the JSON object or array that opens at ``text[start]`` (balanced brackets,
    strings skipped), None when it does not close in ``text``."""
    depth, quote, i = 0, False, start
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == '"':
                quote = False
        elif c == '"':
            quote = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def json_value(text: str):
    """``text`` as JSON, or None when it is not JSON."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, ValueError):
        return None


def arguments_of(name: str, args, text: str, call_id: str = "") -> Call:
    """A Call from a name and arguments read from JSON: a JSON string of an object is read (some models
    write the arguments that way); anything but an object is a malformed call."""
    if isinstance(args, str):
        parsed = json_value(args)
        if not isinstance(parsed, dict):
            return Call(name, None, text, "the arguments are not a JSON object", call_id)
        args = parsed
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return Call(name, None, text, "the arguments are not a JSON object", call_id)
    return Call(name, args, text, None, call_id)


class CallFormat:
    """The interface of a call format (the module docstring; entries in grpo.agent.formats)."""

    name: ClassVar[str] = ""
    native: ClassVar[bool] = False  # the chat template renders the tools (apply_chat_template(tools=...))
    markers: ClassVar[tuple[str, ...]] = ()  # text in a chat template that says it is this family's (auto)
    special_tokens: ClassVar[bool] = False  # the family's markers are special tokens: decode without skipping them
    separator: ClassVar[str] = ""  # what may stand between two units of a block besides blank text
    OPEN: ClassVar[str] = ""  # the text a unit starts with, for the families that mark their calls
    # which parts of a task's worked exchange the conversation shows, in order (a tuning knob: an untrained
    # model imitates the last assistant turn it saw; grpo.agent.examples)
    example_parts: ClassVar[tuple[str, ...]] = ("question", "call", "result", "answer")

    def describe(self, tools: list[Tool]) -> str:
        """Text for the system message that tells the model about ``tools`` (where the template does not)."""
        raise NotImplementedError

    def render_call(self, name: str, arguments: dict) -> str:
        """One call as the model writes it."""
        raise NotImplementedError

    def find_call(self, text: str) -> tuple[int, int] | None:
        """(start, end) character offsets of the first complete unit in ``text``, else None."""
        raise NotImplementedError

    def parse(self, text: str, tools: dict[str, Tool]) -> Call:
        """A one-call unit ``text`` (a span ``find_call`` found) read into name and arguments."""
        raise NotImplementedError

    def parse_all(self, text: str, tools: dict[str, Tool]) -> list[Call]:
        """The calls of the unit ``text``, in the order written (one, except for the list formats)."""
        return [self.parse(text, tools)]

    def may_open(self, rest: str) -> bool:
        """Whether ``rest`` (the text after a unit, its blank start and separator removed) may be the
        start of another unit: it is empty, or a unit has begun in it."""
        return rest == "" or any(m.startswith(rest[:len(m)]) for m in self.openers())

    def openers(self) -> tuple[str, ...]:
        """The texts a unit starts with (``may_open``): ``OPEN`` where the family has one."""
        return (self.OPEN,) if self.OPEN else ()

    def block(self, text: str) -> Block | None:
        """The units of the first call block in ``text`` (the module docstring), None when it has none."""
        first = self.find_call(text)
        if first is None:
            return None
        spans = [first]
        while True:
            rest = text[spans[-1][1]:]
            gap = len(rest) - len(rest.lstrip().lstrip(self.separator).lstrip()) if self.separator else \
                len(rest) - len(rest.lstrip())
            nxt = self.find_call(rest[gap:])
            if nxt is None or nxt[0] != 0:
                return Block(spans, self.may_open(rest[gap:]))
            base = spans[-1][1] + gap
            spans.append((base, base + nxt[1]))

    def answer_text(self, raw: str, plain: str) -> str:
        """What rewards grade of a model turn: ``plain`` (its text without special tokens) unless the family
        writes channels (``raw``: decoded with them)."""
        return plain

    def result_messages(self, call: Call, result: str) -> list[dict]:
        """The messages that show ``result`` of ``call`` to the model."""
        return [{"role": "tool", "name": call.name, "content": result}]

    def calls_message(self, calls: list[Call]) -> dict:
        """The assistant message that makes ``calls`` (worked examples, and rendering result turns)."""
        return {"role": "assistant", "content": "\n".join(self.render_call(c.name, c.arguments or {}) for c in calls)}

    def call_message(self, name: str, arguments: dict) -> dict:
        """The assistant message that makes one call."""
        return self.calls_message([Call(name, arguments, "")])

    def example_messages(self, example: dict) -> list[dict]:
        """A worked exchange {"question", "call": {"name", "arguments"}, "result", "answer"} as messages,
        the parts ``example_parts`` names that the example has; "calls" (a list of calls, and "results"
        a list of their results) shows a turn that makes several calls."""
        specs = example.get("calls") or [example["call"]]
        calls = [Call(c["name"], c["arguments"], "", id=example_call_id(i)) for i, c in enumerate(specs)]
        results = example.get("results") or [example.get("result")]
        parts = {"question": lambda: [{"role": "user", "content": example["question"]}],
                 "call": lambda: [self.calls_message(calls)],
                 "result": lambda: [m for c, r in zip(calls, results) for m in self.result_messages(c, str(r))],
                 "answer": lambda: [{"role": "assistant", "content": example["answer"]}]}
        present = {"call": "call" in example or "calls" in example, "result": "result" in example or "results" in example}
        return [m for p in self.example_parts if present.get(p, p in example) for m in parts[p]()]


def example_call_id(i: int) -> str:
    """A call id of nine letters and digits (the length Mistral's templates require) for the ``i``-th call."""
    return f"call{i:05d}"


def tool_calls_field(calls: list[Call], *, arguments_as_text: bool = False) -> list[dict]:
    """``calls`` as an OpenAI-style ``tool_calls`` list (what chat templates read)."""
    out = []
    for i, c in enumerate(calls):
        args = c.arguments or {}
        fn = {"name": c.name, "arguments": json.dumps(args) if arguments_as_text else args}
        out.append({"id": c.id or example_call_id(i), "type": "function", "function": fn})
    return out


IDENT = re.compile(r"[A-Za-z_][\w.]*")
