"""Run set-up the trainer needs before its first step: seeds, the run folder, the LR schedule."""

from __future__ import annotations

import ctypes
import math
import random
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import torch

from grpo.config import Config, ConfigError


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def make_run_dir(cfg: Config) -> Path:
    """The run folder. A fresh run never writes into another run's folder: appending to its
    metrics or overwriting its checkpoints would lose what is already there."""
    run_dir = Path(cfg.output_dir or f"runs/{datetime.now():%Y%m%d-%H%M%S}")
    fresh = cfg.resume_from_checkpoint is None or (
        cfg.resume_from_checkpoint == "auto" and not (run_dir / "checkpoints" / "latest").exists())
    if fresh and ((run_dir / "metrics.jsonl").exists() or (run_dir / "checkpoints").exists()):
        raise ConfigError(f"output_dir: {run_dir} already holds a run; continue it with "
                          f"grpo train --resume {run_dir}, or choose another output_dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


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
    m_trim_threshold, m_mmap_max = -1, -4  # <malloc.h>
    return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 2**31 - 1))


def adamw(params: list, **settings) -> torch.optim.AdamW:
    """AdamW over ``params``, with PyTorch's fused kernel where every parameter is a float tensor on
    the CPU or a GPU: the same update (to fp32 rounding) in one pass over each tensor, where the
    default foreach path makes several (a full fine-tune of SmolLM2-135M on the 2-core CPU: 0.11 s
    per optimizer step against 0.45 s)."""
    params = list(params)
    fused = bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(params, fused=fused or None, **settings)


def lr_lambda(cfg: Config):
    """Multiplier of learning_rate at a given optimizer step: linear warmup, then the schedule. Both
    are counted in training steps, as max_steps is, each taking num_iterations x mini_batches
    optimizer steps."""
    per_step = cfg.num_iterations * cfg.mini_batches
    total = max(1, cfg.max_steps * per_step)
    warm = cfg.warmup_steps * per_step

    def f(step: int) -> float:
        if step < warm:
            return (step + 1) / (warm + 1)
        progress = (step - warm) / max(1, total - warm)
        if cfg.lr_scheduler_type == "cosine":
            return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
        if cfg.lr_scheduler_type == "linear":
            return max(0.0, 1 - progress)
        return 1.0

    return f
