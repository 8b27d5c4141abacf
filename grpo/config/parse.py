"""Turning YAML values and command-line strings into a config field's type (its type hint), or a
ConfigError naming the key. Kept apart from fields.py so that the dataclass file holds the fields,
their docstrings and their validation."""

from __future__ import annotations

import typing
from typing import Any

import yaml

from grpo.errors import ConfigError


def parse_value(key: str, raw: Any, hint: Any) -> Any:
    """Turn a YAML value or a command-line string into the field's type, or fail naming the key."""
    args = typing.get_args(hint)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), hint) if args else hint
    if raw is None or (isinstance(raw, str) and raw.lower() in ("none", "null") and optional):
        if optional:
            return None
        raise ConfigError(f"{key}: may not be null")
    origin = typing.get_origin(base)
    try:
        if base is dict or origin is dict:  # a YAML mapping, or on the command line a YAML / JSON flow mapping
            value = raw if isinstance(raw, dict) else yaml.safe_load(str(raw))
            if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
                raise ValueError
            return value
        if origin is list:
            items = raw if isinstance(raw, list) else yaml.safe_load(raw) if str(raw).startswith("[") \
                else str(raw).split(",")
            return [float(x) for x in items]
        if base is bool:
            if isinstance(raw, bool):
                return raw
            if str(raw).lower() in ("true", "1", "yes", "on"):
                return True
            if str(raw).lower() in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if base is int:
            if isinstance(raw, bool):
                raise ValueError
            if isinstance(raw, int):
                return raw
            value = float(raw)  # "1e3" and 1000.0 are whole numbers; "25e-1" and 2.5 are not
            if not value.is_integer():
                raise ValueError
            return int(value)
        if base is float:
            if isinstance(raw, bool):
                raise ValueError
            return float(raw)
        if base is str:
            return str(raw)
    except (TypeError, ValueError):
        pass
    name = "a mapping such as {enable_thinking: false}" if base is dict or origin is dict else \
        getattr(base, "__name__", str(base))
    raise ConfigError(f"{key}: expected {name}{' or null' if optional else ''}, got {raw!r}")
