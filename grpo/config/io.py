"""Reading a Config: YAML file + key=value overrides, with errors that name the key and the source;
and the config's documentation (the CLI's key list, the documentation's configuration reference),
generated from the field docstrings and sections so it is written once."""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from grpo.config.fields import Config
from grpo.config.sections import SECTIONS, section
from grpo.config.trl_names import TRL_NAMES, translate
from grpo.errors import ConfigError

ALIASES = {"resume": "resume_from_checkpoint", "rollout_backend": "rollout_engine"}  # the second: the name earlier configs use


def _check_keys(keys, source: str) -> None:
    """Every key is a config field or one of TRL's GRPOConfig names (trl_names.py)."""
    valid = [f.name for f in fields(Config)]
    for k in keys:
        if k not in valid and k not in TRL_NAMES:
            close = difflib.get_close_matches(k, list(dict.fromkeys(valid + list(TRL_NAMES))), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else f"; valid keys: {', '.join(valid)}"
            raise ConfigError(f"unknown config key {k!r} in {source}{hint}")


def config_from(values: dict[str, Any], source: str) -> Config:
    """A validated Config from given keys, grpo's names or TRL's GRPOConfig names (``source`` names
    where they came from in errors)."""
    values = {ALIASES.get(k, k): v for k, v in values.items()}
    _check_keys(values, source)
    return Config(**translate(values))


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Config from an optional YAML file, then `key=value` overrides, then validation."""
    values: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {p} is not valid YAML: {e}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {p} must hold a mapping of key: value")
        loaded = {ALIASES.get(k, k): v for k, v in loaded.items()}
        _check_keys(loaded, str(p))
        values.update(loaded)
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        k, v = item.split("=", 1)
        k = ALIASES.get(k, k)
        _check_keys([k], "the command line")
        values[k] = v
    return Config(**translate(values))


def field_docs() -> dict[str, str]:
    """Each field's docstring, read from Config's source in grpo/config/fields.py (the one place they are written)."""
    tree = ast.parse(inspect.getsource(Config))
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = " ".join(str(nxt.value.value).split())
    return docs


def defaults() -> dict[str, Any]:
    """Each field's default value."""
    return {f.name: f.default for f in fields(Config) if f.default is not dataclasses.MISSING}


def keys_help(only: str | None = None) -> str:
    """The config keys with their defaults and meanings, section by section (``only``: one section's
    name; an unknown name raises KeyError listing the sections)."""
    docs, values = field_docs(), defaults()
    chosen = SECTIONS if only is None else (section(only),)
    out = []
    for s in chosen:
        out.append(f"{s.title} [{s.name}]: {s.reader}")
        out += [f"  {k:<28} {docs[k]} (default: {values[k]!r})" for k in s.fields]
        out.append("")
    return "\n".join(out).rstrip("\n")


def recipes_help(markdown: bool = False) -> str:
    """The published recipes ``recipe=NAME`` takes: each one's settings and its source (plain text for
    ``grpo train --help recipes``, or the configuration reference's section)."""
    from grpo.config.presets import RECIPES

    out = ["## Recipes", "", "`recipe=NAME` sets a paper's objective where the config leaves a field at its "
           "default (an explicit setting wins); `grpo train --help recipes`.", "",
           "| recipe | sets | source |", "| --- | --- | --- |"] if markdown else \
        ["recipe=NAME: a paper's objective, set where the config leaves a field at its default (an explicit "
         "setting wins):", ""]
    for e in RECIPES.entries():
        sets = ", ".join(f"{k}={v}" for k, v in e.value.items()) or "(nothing)"
        out.append(f"| `{e.name}` | {_cell(sets)} | {_cell(e.doc)} |" if markdown else f"  {e.name}: {sets}\n    {e.doc}\n")
    return "\n".join(out).rstrip("\n") + "\n"


def markdown_sections() -> str:
    """The configuration reference's body: one table of keys, defaults and meanings per section,
    generated from ``SECTIONS`` and the field docstrings."""
    docs, values = field_docs(), defaults()
    out = []
    for s in SECTIONS:
        out += [f"## {s.title}", "", f"`grpo train --help {s.name}` &middot; read by {s.reader}.", "",
                "| key | default | meaning |", "| --- | --- | --- |"]
        out += [f"| `{k}` | `{values[k]!r}` | {_cell(docs[k])} |" for k in s.fields]
        out.append("")
    return "\n".join(out)


def _cell(text: str) -> str:
    """A docstring as one markdown table cell (a literal | would end the cell)."""
    return text.replace("|", "\\|")
