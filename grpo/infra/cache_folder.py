"""The one folder grpo keeps its machine-local cache in: the native decode ops' build, the measured
kernel and backend choices, the dequantized embedded model.

``$GRPO_CACHE`` when set, else ``$XDG_CACHE_HOME/grpo``, else ``~/.cache/grpo``. Everything in it is
rebuilt or measured again when missing, so pointing ``GRPO_CACHE`` at an empty folder (as the test
suite does, once per session) gives a run that does not depend on what earlier runs left there.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The cache folder (not created here: each writer makes it when it first writes)."""
    if os.environ.get("GRPO_CACHE"):
        return Path(os.environ["GRPO_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "grpo"
