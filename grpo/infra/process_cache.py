"""Per-process caches: the only module-level state grpo keeps.

A value that is expensive to make and the same for every caller in a process (a checked sandbox
grader, a verifier's worker pool, a kernel plan measured on this machine) is kept in a
``ProcessCache``: a dict with a name, a statement of what makes an entry stale, and a lock under
which an entry is made once. Settings never travel this way: a component gets them in its
constructor. A spawned worker process starts with empty caches of its own.
"""

from __future__ import annotations

import threading
from typing import Callable, Hashable, TypeVar

V = TypeVar("V")


class ProcessCache(dict):
    """A per-process cache: key -> value, each made once (``get_or_make``) under the cache's lock.

    ``holds``: what it caches, in words; ``stale_when``: what would make an entry wrong, and so
    what clears it (the key covers what it can; tests clear a cache or set an entry through
    ``monkeypatch.setitem``). ``notes``: what making its entries measured or read, kept for the
    run's log until taken (``take_notes``)."""

    def __init__(self, holds: str, *, stale_when: str):
        super().__init__()
        self.holds, self.stale_when = holds, stale_when
        self.notes: list[str] = []
        self._lock = threading.RLock()

    def get_or_make(self, key: Hashable, make: Callable[[], V]) -> V:
        """The entry for ``key``, made by ``make()`` the first time (one thread makes it; the others wait)."""
        with self._lock:
            if key not in self:
                self[key] = make()
            return self[key]

    def note(self, message: str) -> None:
        """Keep ``message`` (what an entry's making found) for the run's log."""
        with self._lock:
            self.notes.append(message)

    def take_notes(self) -> list[str]:
        """The notes kept since the last call (each is taken once)."""
        with self._lock:
            out, self.notes = self.notes, []
            return out

    def __repr__(self) -> str:
        return f"ProcessCache({self.holds!r}, {len(self)} entries)"
