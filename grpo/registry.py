"""One mechanism for every extension point: a ``Registry`` of named entries.

Estimators, policy losses, rollout and serving engines, completeness checks, tools, call formats,
rewards, step rewards, presets, tasks and the compared methods are each a ``Registry``. An entry is
added by one call, below its definition in the module that defines it::

    ESTIMATORS = Registry("advantage estimator", field="advantage_estimator")

    def rloo_advantages(rewards, **kw): ...
    ESTIMATORS.register("rloo", Estimator(rloo_advantages, group=True))

    ROLLOUT_ENGINES.register(MyEngine)          # named by its ``name`` attribute
    MONITOR_PRESETS.register("none", {}, doc="No monitor settings.")

``registry[name]`` is the entry; an unknown name raises ``UnknownName`` (a ConfigError) that names the
kind and the config field and lists the valid names. A registry is a read-only mapping (``in``,
iteration in registration order, ``items()``), and ``entries()`` gives each entry with its
description (the ``doc`` given, else the entry's docstring), from which the reference pages are
written. Config validation reads the valid choices from the registries, so a new entry is valid at once.
This module imports only the errors, so every layer (the core included) may use it.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

from grpo.errors import UnknownName

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered entry: its name, the value, and its description."""

    name: str
    value: T
    doc: str


def describe(value: Any) -> str:
    """The description of an entry that was given none: its ``doc`` attribute when it is a string
    (dataclass entries such as ``PolicyLoss``, ``Reward``), else its own docstring, else its
    function's (``fn``), cleaned of indentation; '' when there is none."""
    for candidate in (getattr(value, "doc", None), _own_doc(value), _own_doc(getattr(value, "fn", None))):
        if isinstance(candidate, str) and candidate.strip():
            return inspect.cleandoc(candidate)
    return ""


def _own_doc(value: Any) -> str | None:
    """A function's or class's docstring; an instance's class docstring is not the entry's own."""
    if inspect.isfunction(value) or inspect.isclass(value) or inspect.ismethod(value):
        return value.__doc__
    return None


class Registry(Mapping[str, T]):
    """Named entries of one kind (see the module docstring).

    ``kind``: what an entry is, in words ("policy loss"); ``field``: the config key or flag that names
    one, which errors begin with ('' for none); ``name_of``: how the call ``register(value)`` without a
    name names its entry (default: the value's ``name`` attribute, else its ``__name__``)."""

    def __init__(self, kind: str, *, field: str = "", name_of: Callable[[T], str] | None = None):
        self.kind, self.field = kind, field
        self._name_of = name_of
        self._entries: dict[str, Entry[T]] = {}

    # ---- adding entries -------------------------------------------------------------------------
    def register(self, name: str | T, value: T | None = None, *, doc: str | None = None, replace: bool = False) -> T:
        """Add an entry and return its value: ``register(name, value)``, or ``register(value)`` named by
        ``name_of`` (its ``name`` attribute). A name already taken raises ValueError unless ``replace``
        (a test or a user swapping a built-in on purpose)."""
        if value is None:
            if isinstance(name, str):
                raise TypeError(f"{self.kind}: register({name!r}) needs the value: register(name, value)")
            return self._add(None, name, doc, replace)
        return self._add(name, value, doc, replace)

    def _add(self, name: str | None, value: T, doc: str | None, replace: bool) -> T:
        name = name if name is not None else self._default_name(value)
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind}: an entry needs a non-empty name, got {name!r}")
        if name in self._entries and not replace:
            raise ValueError(f"{self.kind}: {name!r} is already registered")
        self._entries[name] = Entry(name, value, inspect.cleandoc(doc) if doc is not None else describe(value))
        return value

    def _default_name(self, value: T) -> str | None:
        if self._name_of is not None:
            return self._name_of(value)
        return getattr(value, "name", None) or getattr(value, "__name__", None)

    def unregister(self, name: str) -> T:
        """Remove an entry and return it (tests that register one of their own)."""
        return self._entries.pop(name).value if name in self._entries else self[name]

    # ---- looking up -----------------------------------------------------------------------------
    def __getitem__(self, name: str) -> T:
        try:
            return self._entries[name].value
        except (KeyError, TypeError):  # TypeError: an unhashable name
            raise self.unknown(name) from None

    def lookup(self, name: str, *, field: str | None = None, also: tuple[str, ...] = ()) -> T:
        """``self[name]``, its error naming ``field`` (a command-line flag, say) instead of the
        registry's, and listing ``also`` (names the caller resolves itself, e.g. "auto") first."""
        if name in self._entries:
            return self._entries[name].value
        raise self.unknown(name, field=field, also=also)

    def unknown(self, name: Any, *, field: str | None = None, also: tuple[str, ...] = (), hint: str = "") -> UnknownName:
        """The error for a name not in the registry: ``field: unknown <kind> 'name'; valid: a, b, c``."""
        field = self.field if field is None else field
        valid = ", ".join([*also, *self._entries])
        return UnknownName(f"{field + ': ' if field else ''}unknown {self.kind} {name!r}; valid: {valid}{hint}")

    def __contains__(self, name: object) -> bool:
        try:
            return name in self._entries
        except TypeError:
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        """Every name, in registration order."""
        return list(self._entries)

    def entries(self) -> list[Entry[T]]:
        """Every entry with its description, in registration order (what reference pages list)."""
        return list(self._entries.values())

    def doc(self, name: str) -> str:
        """The description of entry ``name``."""
        if name not in self._entries:
            raise self.unknown(name)
        return self._entries[name].doc

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"
