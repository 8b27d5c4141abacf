"""Environments in TRL's ``environment_factory`` form, used unchanged.

The factory (``module:Class`` or any callable) makes a fresh instance per completion. ``reset`` (called
with the sample's fields its signature takes: all of them when it takes ``**kwargs``, as TRL passes
them) may return text, which is appended to the prompt's last user message. Every public method
other than ``reset`` and ``get_reward`` (found on the class, as TRL does, so properties are not
evaluated) is a tool whose calls change the instance's state. An optional ``get_reward()`` (or
``async def``) scores the episode once it ended: its value reaches rewards as
``sample["environment_reward"]`` (the built-in reward ``environment``).
"""

from __future__ import annotations

import asyncio
import inspect

from grpo.agent.openenv import is_openenv, openenv_factory
from grpo.agent.tools import Tool, check_unique, make_tool, resolve_callable
from grpo.errors import ConfigError

RESERVED = ("reset", "get_reward", "described_tools")


def load_factory(spec: str):
    """The callable ``environment_factory`` names (``module:Class``, or ``openenv:URL``: sessions of an
    OpenEnv server, grpo.agent.openenv)."""
    if is_openenv(spec):
        return openenv_factory(spec)
    factory = resolve_callable(spec.strip(), "environment_factory")
    if not callable(factory):
        raise ConfigError(f"environment_factory: {spec!r} is not callable")
    return factory


def is_routed(spec: str) -> bool:
    """Whether ``environment_factory`` is TRL's dict form, written ``value=module:Class,...``."""
    return "=" in spec


def load_factories(spec: str) -> dict:
    """TRL's dict ``environment_factory`` (``value=module:Class,...``): the column value -> callable
    that routes a row to its environment (the column: ``environment_column``)."""
    out = {}
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        key, sep, target = part.partition("=")
        if not sep or not key.strip() or not target.strip():
            raise ConfigError(f"environment_factory: {part!r} is not value=module:Class (the dict form)")
        if key.strip() in out:
            raise ConfigError(f"environment_factory: the value {key.strip()!r} is routed twice")
        out[key.strip()] = load_factory(target)
    return out


def new_environment(factory, where: str = "environment_factory"):
    """A fresh instance; it must have a callable ``reset`` (TRL's contract)."""
    env = factory()
    if not callable(getattr(env, "reset", None)):
        raise ConfigError(f"{where}: {type(env).__name__} has no reset() method")
    return env


def environment_tools(env) -> list[Tool]:
    """The instance's public methods (those of its class: no property is evaluated) as tools; an
    instance that describes its tools itself (``described_tools()``, e.g. an OpenEnv session whose
    tool's schema is the server's) gives those."""
    if callable(getattr(type(env), "described_tools", None)):
        tools = env.described_tools()
        check_unique(tools, "environment_factory")
        return tools
    names = [n for n, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
             if n not in RESERVED and not n.startswith("_")]
    tools = [make_tool(getattr(env, n), f"environment_factory ({type(env).__name__}.{n})") for n in names]
    check_unique(tools, "environment_factory")
    return tools


def reset_environment(env, sample: dict) -> str | None:
    """``env.reset`` with the sample fields its signature takes; the text it returned, or None."""
    params = inspect.signature(env.reset).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        kwargs = dict(sample)
    else:
        names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        kwargs = {k: v for k, v in sample.items() if k in names}
    out = env.reset(**kwargs)
    if inspect.isawaitable(out):
        out = asyncio.run(_awaited(out))
    return None if out is None else str(out)


async def _awaited(x):
    return await x


def environment_reward(env) -> float | None:
    """``env.get_reward()`` (awaited when async); None when the class has none or it failed."""
    fn = getattr(env, "get_reward", None)
    if not callable(fn):
        return None
    try:
        out = fn()
        if inspect.isawaitable(out):
            out = asyncio.run(_awaited(out))
        return None if out is None else float(out)
    except Exception:  # counted by the reward as a failure (None), like any reward that cannot decide
        return None
