"""Process set-up before a run's first step: seeds, the run folder, the folders modules import from,
glibc's handling of freed memory."""

from __future__ import annotations

import ctypes
import importlib
import os
import random
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import torch

from grpo.errors import ConfigError


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def make_run_dir(output_dir: str, resume_from_checkpoint: str | None, *, command: str = "grpo train") -> Path:
    """The run folder (``output_dir``, or runs/<date-time>). A fresh run never writes into another
    run's folder: appending to its metrics or overwriting its checkpoints would lose what is already there.
    ``command`` is the one the error names to continue the run with."""
    run_dir = Path(output_dir or f"runs/{datetime.now():%Y%m%d-%H%M%S}")
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"output_dir: {run_dir} is a file, not a folder; choose another output_dir")
    fresh = resume_from_checkpoint is None or (
        resume_from_checkpoint == "auto" and not (run_dir / "checkpoints" / "latest").exists())
    if fresh and ((run_dir / "metrics.jsonl").exists() or (run_dir / "checkpoints").exists()):
        raise ConfigError(f"output_dir: {run_dir} already holds a run; continue it with "
                          f"{command} --resume {run_dir}, or choose another output_dir")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file where a parent folder should be, no permission, a read-only disk
        raise ConfigError(f"output_dir: cannot create {run_dir}: {e}") from None
    return run_dir


def import_from(*folders: str) -> None:
    """Put ``folders`` first on the module search path, in order (empty ones skipped), as ``python -m``
    puts the current folder: ``module:name`` references (rewards, tools, environments) then find the
    user's own modules. Processes spawned later (the reward workers) inherit the path."""
    for folder in reversed([os.path.abspath(f) for f in folders if f]):
        while folder in sys.path:
            sys.path.remove(folder)
        sys.path.insert(0, folder)
    importlib.invalidate_caches()


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory for reuse: no allocation served by its own mmap (which
    free() unmaps) and no trimming of the heap's top. PyTorch's CPU allocator calls malloc and free
    per tensor, so without this each large temporary of a training step is new memory to the kernel,
    faulted in and zeroed page by page (4 KiB each); with it, steps after the heap has grown to the
    step's peak touch only pages they already own. Process-wide; False (and nothing changed) off
    Linux or without glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc only: musl and others have no such mallopt parameters
    except (OSError, AttributeError):
        return False
    return bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))


_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # <malloc.h>


def default_memory_policy() -> bool:
    """glibc's malloc back to its default values (mmap for large blocks, a 128 KiB trim threshold), set
    explicitly, which also fixes the mmap threshold glibc would otherwise adjust as it runs: undoes
    ``keep_freed_memory`` for the test suite's isolation between tests; False off glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version
    except (OSError, AttributeError):
        return False
    return bool(libc.mallopt(_M_MMAP_MAX, 65536)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 128 * 1024))
