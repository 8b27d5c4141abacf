"""A run's stop request (SIGINT, SIGTERM): a flag that loops look at, and a region in which the
signal also raises.

A loop looks at ``StopFlag.signal`` between its units of work (a training step, a decode step, an
evaluation batch). Some calls hold the main thread for long without such a point: the prefill of a
whole evaluation batch is one forward pass (tens of seconds for 200 prompts on a CPU). Inside
``abortable()`` the handler therefore also raises ``StopRequested`` in the main thread, as Python's
own KeyboardInterrupt does, so such a call ends at its next Python-level operation. Only work whose
result is then dropped belongs inside; its caller catches ``StopRequested``.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Iterator


class StopRequested(BaseException):
    """Raised by a stop signal inside ``StopFlag.abortable()``. A BaseException, as KeyboardInterrupt,
    so no ``except Exception`` on the way (a library's, a reward's) swallows it."""


class StopFlag:
    """The stop request of one process: ``signal`` names the first stop signal received (None until
    then); ``handler`` is what ``signal.signal`` installs."""

    def __init__(self):
        self.signal: str | None = None
        self._armed = False  # inside abortable(): the next signal raises

    def handler(self, signum: int, _frame) -> None:
        self.signal = self.signal or signal.Signals(signum).name
        if self._armed:
            self._armed = False  # once: a second signal while this one unwinds only sets the flag
            raise StopRequested(self.signal)

    @contextmanager
    def abortable(self) -> Iterator[None]:
        """A region (not nested) that a stop signal ends by raising StopRequested (one already
        received: at once)."""
        if self.signal is not None:
            raise StopRequested(self.signal)
        self._armed = True
        try:
            yield
        finally:
            self._armed = False
