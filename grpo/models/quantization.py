"""QLoRA's base (Dettmers et al. 2023, arXiv 2305.14314): the policy's linear layers stored in 4-bit
NormalFloat by bitsandbytes, the LoRA adapters trained in ``dtype`` on top, the reference the same
quantized base with the adapters off.

Whether bitsandbytes can run 4-bit on a device depends on its build and backends (CUDA; a CPU
backend in recent releases), so it is measured, not assumed: ``check_4bit`` quantizes a small layer
on the device and runs it before any model loads.
"""

from __future__ import annotations

import torch

from grpo.errors import ConfigError

QUANT_TYPE = "nf4"  # QLoRA's 4-bit NormalFloat


def _probe(device: torch.device) -> float:
    """Relative error of a small NF4 layer's output on ``device`` against the dense product."""
    import bitsandbytes as bnb

    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 128, generator=gen)  # [O, I]
    x = torch.randn(4, 128, generator=gen)  # [R, I]
    layer = bnb.nn.Linear4bit(128, 64, bias=False, compute_dtype=torch.float32, quant_type=QUANT_TYPE)
    layer.weight = bnb.nn.Params4bit(w, requires_grad=False, quant_type=QUANT_TYPE)
    layer = layer.to(device)
    if layer.weight.dtype != torch.uint8 or layer.weight.quant_state is None:
        raise RuntimeError("the weight was not quantized")
    with torch.no_grad():
        y = layer(x.to(device)).float().cpu()  # [R, O]
    return float((y - x @ w.T).norm() / (x @ w.T).norm())


def check_4bit(device: torch.device) -> None:
    """A ConfigError naming ``device`` where bitsandbytes cannot quantize to 4 bits and run there (or
    gives a product off by more than 4-bit rounding: NF4's relative error is about 0.1)."""
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise ConfigError("load_in_4bit: needs the bitsandbytes package (pip install -e '.[qlora]')") from None
    try:
        err = _probe(device)
    except Exception as e:
        raise ConfigError(f"load_in_4bit: bitsandbytes {bitsandbytes.__version__} cannot run 4-bit layers on "
                          f"device {device} ({type(e).__name__}: {str(e)[:200]}); use load_in_4bit=false") from None
    if not err < 0.3:
        raise ConfigError(f"load_in_4bit: bitsandbytes' 4-bit product on device {device} is off by {err:.2f} "
                          f"(relative); its backend there is not usable; use load_in_4bit=false")


def quantization_config(dtype: torch.dtype):
    """transformers' BitsAndBytesConfig of the 4-bit base: NF4 weights, products in ``dtype``."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=QUANT_TYPE, bnb_4bit_compute_dtype=dtype)
