"""What every benchmark prints beside its figures: the CPU (and whether it has AVX-512) and the commit."""

from __future__ import annotations

import os
import re
import subprocess


def cpu_line() -> str:
    """The CPU model, its cores and its AVX-512 flags (``grep -o 'avx512[a-z_0-9]*' /proc/cpuinfo``)."""
    text = open("/proc/cpuinfo").read()
    flags = sorted(set(re.findall(r"avx512[a-z_0-9]*", text)))
    model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), "?")
    return f"{model}, {os.cpu_count()} cores, AVX-512: {' '.join(flags) or 'none (AVX2)'}"


def commit() -> str:
    """The checkout's short commit id, '?' outside a git checkout."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"
