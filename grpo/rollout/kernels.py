"""Matrix products for decoding on CPU: why a batch-8 product runs below memory bandwidth, and the fix.

Measured on the 2-core AMD EPYC (AVX512) this project runs on, fp32, one thread: ``F.linear`` of 8
rows by a [1536, 576] weight (MKL sgemm on the [out, in] layout, packing the weight on every call)
reaches ~60 GFLOP/s, and by the [49152, 576] output layer ~20 GFLOP/s; a decode step of 8 rows is
2 * params * 8 FLOPs, so at batch 8 the step is bound by the product's arithmetic, not by reading the
weights. oneDNN's inner-product primitive on weights reordered ONCE into its blocked layout runs the
same fp32 products at ~95 GFLOP/s (the machine's peak for one core) and the output layer at ~2.5x
MKL's speed. The reorder is a copy of each weight made once per rollout (the weights change every
optimiser step) and freed after it. The results are fp32 products summed in another order: equal to
MKL's to fp32 rounding (~1e-6 relative), not bitwise; the sampling distribution is the policy's.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


def onednn_available() -> bool:
    """oneDNN's packed fp32 linear is there (CPU builds of torch with mkldnn)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


@contextmanager
def packed_linears(model, *, enabled: bool = True, only=None):
    """Within the block, every plain fp32 CPU ``nn.Linear`` of ``model`` (or of the modules ``only``)
    runs oneDNN's inner product on a weight reordered once on entry (inference only: no autograd
    through it). Yields the set of patched modules; on exit their own forward is back and the packed
    copies are freed."""
    patched = {}  # module -> the forward it had as an instance attribute (a wrapper such as keep_head_fp32's), or None
    if enabled and onednn_available():
        for mod in (model.modules() if only is None else only):
            w = mod.weight if type(mod) is torch.nn.Linear else None
            if w is None or w.dtype != torch.float32 or w.device.type != "cpu":
                continue
            patched[mod] = vars(mod).get("forward")
            mod.forward = packed_linear(w.detach(), mod.bias.detach() if mod.bias is not None else None)
    try:
        yield set(patched)
    finally:
        for mod, own in patched.items():
            if own is None:
                del mod.forward  # the class's forward is back
            else:
                mod.forward = own


def packed_linear(weight: torch.Tensor, bias: torch.Tensor | None):
    """x -> x @ weight.T + bias through oneDNN's inner product, the fp32 weight [out, in] reordered
    once here into oneDNN's blocked layout (a copy, freed with the returned function)."""
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, 8)

    def forward(x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [None], "")
    return forward


def head_chunks(weight: torch.Tensor, bias: torch.Tensor | None) -> tuple:
    """An output layer's (weight [V, H], bias [V] or None) in blocks of 2048 rows. MKL runs 8 rows x
    [49152, 576]^T ~1.5x faster block by block (each block stays in cache while the rows go by), with
    bitwise the same logits: each block is the same dot products."""
    blocks = -(-weight.shape[0] // 2048)
    return tuple(zip(weight.split(2048), bias.split(2048) if bias is not None else [None] * blocks))
