"""QLoRA's base (Dettmers et al. 2023, arXiv 2305.14314): the policy's linear layers stored in 4-bit
NormalFloat by bitsandbytes, the LoRA adapters trained in ``dtype`` on top, the reference the same
quantized base with the adapters off.

Whether bitsandbytes can run 4-bit on a device depends on its build and backends (CUDA; a CPU
backend in recent releases), so it is measured, not assumed: ``check_4bit`` quantizes a small layer
on the device and runs it before any model loads.

QLoRA trains through the frozen 4-bit layers: the adapters below a layer get their gradient through
that layer's input gradient, ``dL/dx = dL/dy @ dequant(W)``. On a CPU with AVX512-BF16, bitsandbytes'
``Linear4bit`` repacks its weight into an inference layout the first time it runs in eval mode on an
input without grad (as sampling and evaluation do), and from then on runs every product, training
ones included, through a kernel that has no backward: no gradient reaches the layer's input, silently.
``keep_trainable`` keeps every 4-bit layer out of that branch; ``check_4bit`` runs the sequence a
training step runs (a no-grad eval forward, then a forward and backward in train mode) on a layer
built and guarded the same way, so a bitsandbytes that repacks by another route is caught at start-up.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from torch import nn

from grpo.errors import ConfigError
from grpo.infra.quiet import held_back

QUANT_TYPE = "nf4"  # QLoRA's 4-bit NormalFloat
DOUBLE_QUANT = False  # the block scales kept in fp32 (QLoRA's double quantization off), load and probe alike
GRADIENT_TOLERANCE = 1e-4  # fp32 rounding of one product, relative: the input gradient against the dense one


def keep_trainable(model: nn.Module) -> int:
    """Keep every bitsandbytes 4-bit layer of ``model`` on its differentiable path; return how many.

    bitsandbytes enables the CPU repack per layer (``support_avx512bf16_for_cpu``, set where the CPU
    has AVX512-BF16); the flag is cleared, so sampling and evaluation run the same products as training.
    A layer already repacked cannot be restored faithfully (the repack rounds the block scales to bf16),
    so it is a ConfigError: the model must be loaded again and guarded before it samples."""
    bnb = sys.modules.get("bitsandbytes")  # a model holding 4-bit layers has imported it
    if bnb is None:
        return 0
    n = 0
    for name, m in model.named_modules():
        if isinstance(m, bnb.nn.Linear4bit):
            if getattr(m.weight.quant_state, "packing_format_for_cpu", False):
                raise ConfigError(f"load_in_4bit: layer {name or type(m).__name__} was repacked for CPU inference "
                                  "(no backward) before training; load the model again and call keep_trainable "
                                  "before it samples")
            m.support_avx512bf16_for_cpu = False
            n += 1
    return n


@dataclass(frozen=True)
class SequenceErrors:
    """Relative errors of a 4-bit layer through a training step's sequence."""

    output: float  # the eval-mode no-grad output against the product of the unquantized weight (NF4 error)
    gradient: float  # the train-mode input gradient against that of the dequantized weight (fp32 rounding)


def sequence_errors(layer: nn.Module, weight: torch.Tensor, x: torch.Tensor) -> SequenceErrors:
    """Run on ``layer`` (a Linear4bit quantized from ``weight`` [O, I]) what a step runs: a no-grad
    forward in eval mode (the rollout), then a forward and backward in train mode (the update), and
    compare against dense products. A gradient that never reaches ``x`` counts as zero (error 1)."""
    import bitsandbytes.functional as bnbf

    gen = torch.Generator().manual_seed(1)
    w_nf4 = bnbf.dequantize_4bit(layer.weight.data, layer.weight.quant_state).float().cpu()  # [O, I], before any run
    layer.eval()
    with torch.no_grad():
        y = layer(x).float().cpu()  # [R, O]
    layer.train()
    xg = x.detach().clone().requires_grad_(True)  # [R, I]
    out = layer(xg)  # [R, O]
    g = torch.randn(out.shape, generator=gen)  # [R, O]
    if out.requires_grad:
        out.backward(g.to(out.device, out.dtype))
    got = xg.grad.float().cpu() if xg.grad is not None else torch.zeros(x.shape)  # [R, I]
    dense, want = x.float().cpu() @ weight.T, g @ w_nf4  # [R, O], [R, I]
    return SequenceErrors(output=float((y - dense).norm() / dense.norm()),
                          gradient=float((got - want).norm() / want.norm()))


def nf4_layer(weight: torch.Tensor, device: torch.device) -> nn.Module:
    """A Linear4bit holding ``weight`` [O, I] in NF4 on ``device``, built as a 4-bit load builds its
    layers (``quantization_config``) and guarded by ``keep_trainable``."""
    import bitsandbytes as bnb

    out_f, in_f = weight.shape
    layer = bnb.nn.Linear4bit(in_f, out_f, bias=False, compute_dtype=torch.float32, quant_type=QUANT_TYPE,
                              compress_statistics=DOUBLE_QUANT)
    layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, quant_type=QUANT_TYPE,
                                     compress_statistics=DOUBLE_QUANT, module=layer)
    layer = layer.to(device)
    if layer.weight.dtype != torch.uint8 or layer.weight.quant_state is None:
        raise RuntimeError("the weight was not quantized")
    keep_trainable(layer)
    return layer


def _probe(device: torch.device) -> SequenceErrors:
    # 64 outputs and 128 inputs: a shape bitsandbytes' CPU repack takes (rows in blocks of 32, inputs in whole
    # 64-wide scale blocks), so the probe meets the repack wherever the model's layers would
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 128, generator=gen)  # [O, I]
    x = torch.randn(4, 128, generator=gen)  # [R, I]
    return sequence_errors(nf4_layer(w, device), w, x.to(device))


def check_4bit(device: torch.device) -> None:
    """A ConfigError naming ``device`` where bitsandbytes cannot quantize to 4 bits and run there, gives
    a product off by more than 4-bit rounding (NF4's relative error is about 0.1), or, after a no-grad
    eval forward, a training backward whose input gradient is not that of the dequantized weight."""
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise ConfigError("load_in_4bit: needs the bitsandbytes package (pip install -e '.[qlora]')") from None
    for message in held_back():  # what bitsandbytes said at import about its 4-bit kernels: this run's concern
        print(f"bitsandbytes: {message}", file=sys.stderr, flush=True)
    try:
        err = _probe(device)
    except Exception as e:
        raise ConfigError(f"load_in_4bit: bitsandbytes {bitsandbytes.__version__} cannot run 4-bit layers on "
                          f"device {device} ({type(e).__name__}: {str(e)[:200]}); use load_in_4bit=false") from None
    if not err.output < 0.3:
        raise ConfigError(f"load_in_4bit: bitsandbytes' 4-bit product on device {device} is off by {err.output:.2f} "
                          f"(relative); its backend there is not usable; use load_in_4bit=false")
    if not err.gradient < GRADIENT_TOLERANCE:
        raise ConfigError(f"load_in_4bit: bitsandbytes {bitsandbytes.__version__} on device {device}: after an "
                          f"eval-mode forward without grad, a 4-bit layer's input gradient is off by "
                          f"{err.gradient:.2g} (relative); LoRA's gradients would be wrong; use load_in_4bit=false")


def quantization_config(dtype: torch.dtype):
    """transformers' BitsAndBytesConfig of the 4-bit base: NF4 weights, products in ``dtype``."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=QUANT_TYPE, bnb_4bit_compute_dtype=dtype,
                              bnb_4bit_use_double_quant=DOUBLE_QUANT)
