"""Precision on this machine: whether bf16 runs natively, and an LM head kept in fp32 under autocast."""

from __future__ import annotations

import os

import torch
from torch import nn


def native_bf16(device: torch.device) -> bool:
    """Whether bf16 matrix products run natively: CUDA with bf16, or a CPU with AVX512-BF16/AMX."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()  # capped below AVX512-BF16 (bench/as_avx2.sh)
    if isa not in ("ALL", "DEFAULT") and "BF16" not in isa and "AMX" not in isa:
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def keep_head_fp32(model: nn.Module) -> None:
    """Run the LM head outside autocast, in the weights' dtype.

    Under bf16 autocast the logits would carry about 3 significant digits, an error of ~0.1 on a
    logit of 20, which is noise in log pi; the head is a small share of the compute, so it stays exact.
    """
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear) or getattr(head, "_grpo_fp32", False):
        return
    plain = head.forward

    def forward(x):
        with torch.autocast(x.device.type, enabled=False):
            return plain(x.to(head.weight.dtype))

    head.forward = forward
    head._grpo_fp32 = True
