"""The machine a measurement was taken on, as every figure of grpo's states it (the model card's
evaluation, the benchmarks): the CPU's model and vector instruction class, the accelerator, torch, and
the UTC time."""

from __future__ import annotations

import datetime as dt
import os
import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo; the platform's processor name elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_isa() -> str:
    """The CPU's vector class (AVX-512 with its extensions, AVX2, or neither), from its feature flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    flags = set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            flags.update(line.split(":", 1)[1].split())
    avx512 = sorted(f for f in flags if f.startswith("avx512"))
    if avx512:
        return "AVX-512 (" + " ".join(avx512) + (", AMX" if "amx_tile" in flags else "") + ")"
    return "AVX2" if "avx2" in flags else platform.machine()


def machine_record() -> dict:
    """cpu, isa, cores, accelerator (None on the CPU), torch, and utc (ISO date and time)."""
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu_model(), "isa": cpu_isa(), "cores": os.cpu_count(), "accelerator": gpu,
            "torch": torch.__version__, "utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M")}
