"""Tools: plain typed Python functions with a Google-style docstring, found by name.

A tool is given as ``builtin:NAME`` (``BUILTIN_TOOLS``) or ``module:function``; its JSON schema is the
one transformers derives from the signature and docstring (``transformers.utils.get_json_schema``:
each argument needs a type hint and an ``Args:`` line), which is also what a chat template with tool
support renders. ``async def`` tools are run on an event loop of their own (``execute.py``).
Arguments a model wrote are checked against the schema's types before the call (``argument_error``).
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Callable

from grpo.agent.calculator import calc
from grpo.errors import ConfigError
from grpo.registry import Registry

# named as the `tools` key gives them: builtin:NAME
BUILTIN_TOOLS: Registry[Callable] = Registry("built-in tool", field="tools")
# builtin:calculator is shown to the model as `calc`: on the untrained embedded model the short name drew
# 66% well-formed calls against 3-22% for `calculator(` (docs/benchmarks/tool-format.md)
BUILTIN_TOOLS.register("builtin:calculator", calc)


@dataclass(frozen=True)
class Tool:
    """A callable the model may call, with the schema it is described by."""

    name: str
    fn: Callable
    schema: dict  # {"type": "function", "function": {"name", "description", "parameters", ...}}
    is_async: bool

    @property
    def parameters(self) -> dict:
        """The JSON schema of the arguments: {"type": "object", "properties": {...}, "required": [...]}."""
        return self.schema["function"].get("parameters", {"type": "object", "properties": {}})

    @property
    def description(self) -> str:
        return self.schema["function"].get("description", "")


def make_tool(fn: Callable, where: str = "tools") -> Tool:
    """The Tool of ``fn`` (a function or a bound method); ConfigError naming ``where`` when transformers
    cannot derive its schema (a missing type hint or docstring line)."""
    from transformers.utils import get_json_schema

    try:
        schema = get_json_schema(fn)
    except Exception as e:
        raise ConfigError(f"{where}: {getattr(fn, '__name__', fn)!r} cannot be described to the model "
                          f"({type(e).__name__}: {e}); give it type hints and a Google-style docstring "
                          "with an Args: line per argument") from None
    return Tool(name=fn.__name__, fn=fn, schema=schema, is_async=inspect.iscoroutinefunction(fn))


def resolve_callable(spec: str, where: str):
    """The object a ``module:attribute`` path names; ConfigError naming ``where`` otherwise."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ConfigError(f"{where}: {spec!r} is not builtin:NAME or module:function")
    try:
        obj = importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"{where}: cannot import {module!r} ({e})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{where}: {module!r} has no {attr!r}")
        obj = getattr(obj, part)
    return obj


def resolve_tool(spec: str) -> Tool:
    """``builtin:NAME`` or ``module:function`` as a Tool; an unknown built-in lists the valid ones."""
    spec = spec.strip()
    if spec.startswith("builtin:"):
        return make_tool(BUILTIN_TOOLS[spec])
    fn = resolve_callable(spec, "tools")
    if not callable(fn):
        raise ConfigError(f"tools: {spec!r} is not callable")
    return make_tool(fn)


def resolve_tools(specs: str | list[str]) -> list[Tool]:
    """A comma-separated list (or a list) of tool names as Tools; two tools of one name are an error."""
    names = [s.strip() for s in (specs.split(",") if isinstance(specs, str) else specs) if s.strip()]
    tools = [resolve_tool(s) for s in names]
    check_unique(tools, "tools")
    return tools


def check_unique(tools: list[Tool], where: str) -> None:
    seen = set()
    for t in tools:
        if t.name in seen:
            raise ConfigError(f"{where}: two tools are named {t.name!r}")
        seen.add(t.name)


_JSON_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
               "array": (list, tuple), "object": (dict,), "null": (type(None),)}


def _type_ok(value, spec: dict) -> bool:
    if "anyOf" in spec:
        return any(_type_ok(value, s) for s in spec["anyOf"])
    kinds = spec.get("type")
    if kinds is None:
        return True
    kinds = kinds if isinstance(kinds, list) else [kinds]
    for kind in kinds:
        allowed = _JSON_TYPES.get(kind)
        if allowed is None:
            return True  # a type this check does not know: the tool decides
        if isinstance(value, bool) and kind in ("integer", "number"):
            continue  # JSON's true is not a number
        if isinstance(value, allowed):
            return True
    return False


def argument_error(tool: Tool, arguments) -> str | None:
    """Why ``arguments`` (the model's) do not fit the tool's schema: not an object, a missing
    required argument, an unknown one, a value of the wrong JSON type; None when they fit."""
    if not isinstance(arguments, dict):
        return f"arguments must be an object of named values, not {type(arguments).__name__}"
    params = tool.parameters
    props = params.get("properties", {})
    missing = [k for k in params.get("required", []) if k not in arguments]
    if missing:
        return f"missing argument(s) {', '.join(missing)}"
    unknown = [k for k in arguments if k not in props]
    if unknown:
        return f"unknown argument(s) {', '.join(unknown)}; {tool.name} takes {', '.join(props) or 'none'}"
    for k, v in arguments.items():
        if not _type_ok(v, props[k]):
            return f"argument {k} must be of type {props[k].get('type')}, got {type(v).__name__} {v!r:.40}"
    return None
