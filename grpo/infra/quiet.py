"""Dependency output that says nothing about the run, kept off the terminal.

bitsandbytes logs, at import, a warning that its optional CPU 4-bit kernel could not be fetched from a
hub repository it does not trust (on CPUs with AVX512-BF16); peft imports bitsandbytes wherever it is
installed, so every run would start with a line about a failure and a trust setting, QLoRA or not. The
warning is held back here and shown by the QLoRA check, the one place it concerns (``held_back``).
transformers' progress bars for loading and saving a small model's weights last a fraction of a second
and, in a log, read as a wall of carriage returns; hub downloads keep theirs (huggingface_hub's own).
"""

from __future__ import annotations

import logging

BITSANDBYTES_CPU = "bitsandbytes.backends.cpu.ops"  # the logger of the kernel-fetch warning


class HeldBack(logging.Filter):
    """Keeps the records whose message holds one of ``parts`` instead of letting them through."""

    def __init__(self, *parts: str):
        super().__init__()
        self.parts = parts
        self.messages: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(p in message for p in self.parts):
            self.messages.append(message)
            return False
        return True


def _held(logger: logging.Logger) -> HeldBack | None:
    return next((f for f in logger.filters if isinstance(f, HeldBack)), None)


def quiet_dependencies() -> None:
    """Hold back bitsandbytes' kernel-fetch warning (idempotent; call before bitsandbytes is imported:
    the warning comes at import)."""
    logger = logging.getLogger(BITSANDBYTES_CPU)
    if _held(logger) is None:
        logger.addFilter(HeldBack("gemm_4bit_forward"))


def no_weight_progress_bars() -> None:
    """transformers' progress bars off (loading, converting and saving weights); called where a model loads."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def held_back() -> list[str]:
    """The dependency warnings held back so far (for the component they concern to show)."""
    held = _held(logging.getLogger(BITSANDBYTES_CPU))
    return list(held.messages) if held is not None else []
