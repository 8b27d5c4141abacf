"""The worked exchange a tools run shows before a prompt whose row has none: one user question and
the assistant's call, built from a call the user gives once (``tool_example_call``) or from the first
tool's own schema.

Why it ends on the call (measured on the untrained embedded SmolLM2-135M-Instruct, docs/benchmarks/tool-format.md):
a description of the tools alone drew no calls, and an exchange that went on to the result and a
final answer drew 0-6% (the model imitates the last assistant turn it saw); the exchange ending on
the call drew 66% well-formed calls.
"""

from __future__ import annotations

import re

from grpo.agent.formats import PythonCallFormat
from grpo.agent.tools import Tool
from grpo.errors import ConfigError

NO_EXAMPLE = "none"  # tool_example_call=none: no worked exchange
PLACEHOLDERS = {"string": "text", "integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}
_FOR_EXAMPLE = re.compile(r"""(?:for example|e\.g\.|such as)[:,]?\s*(?:"([^"]+)"|'([^']+)'|([^\s,;)]+))""", re.I)


def example_value(spec: dict):
    """A value for an argument of JSON schema ``spec``: its docstring's 'for example X' (read as the
    argument's type), its first enum value, or a placeholder of its type."""
    kind = spec.get("type", "string")
    kind = kind[0] if isinstance(kind, list) else kind
    m = _FOR_EXAMPLE.search(spec.get("description", ""))
    if m:
        text = next(g for g in m.groups() if g is not None).rstrip(".")
        try:
            return {"integer": int, "number": float}.get(kind, str)(text)
        except ValueError:
            pass
    if spec.get("enum"):
        return spec["enum"][0]
    return PLACEHOLDERS.get(kind, "text")


def schema_call(tool: Tool) -> dict:
    """A call of ``tool`` with an example value for each required argument (all of them if none is required)."""
    props = tool.parameters.get("properties", {})
    names = tool.parameters.get("required") or list(props)
    return {"name": tool.name, "arguments": {k: example_value(props.get(k, {})) for k in names}}


def parse_call(text: str, tools: list[Tool]) -> dict:
    """``text``, a call written as the python format writes one (``lookup(city="Paris")``), read against
    the tools' schemas; a ConfigError naming tool_example_call when it is not one call of a known tool."""
    fmt = PythonCallFormat()
    span = fmt.find_call(text)
    known = {t.name: t for t in tools}
    call = fmt.parse(text[span[0]:span[1]], known) if span is not None else None
    if call is None or call.name not in known or call.error or call.arguments is None:
        why = "no call NAME(arguments) in it" if call is None else f"no tool named {call.name!r}" \
            if call.name not in known else call.error or "its arguments cannot be read"
        raise ConfigError(f"tool_example_call: {text!r} is not a call of one of the tools "
                          f"({', '.join(known) or 'none'}): {why}")
    return {"name": call.name, "arguments": call.arguments}


def worked_example(tools: list[Tool], *, call: str = "", question: str = "") -> dict | None:
    """The run-level worked exchange {"question", "call": {"name", "arguments"}} (the per-row
    ``tool_example`` form without the result and answer): ``call`` parsed, or built from the first
    tool's schema when ''; None for ``call='none'`` or no tools. ``question`` '' is the called tool's
    description followed by the call's arguments."""
    if not tools or call.strip().lower() == NO_EXAMPLE:
        return None
    made = parse_call(call, tools) if call.strip() else schema_call(tools[0])
    if not question:
        tool = next(t for t in tools if t.name == made["name"])
        values = ", ".join(str(v) for v in made["arguments"].values())
        question = f"{tool.description.rstrip('.') or f'Use {tool.name}'}: {values}" if values else tool.description
    return {"question": question, "call": made}
