"""torch_compile: the policy loss and the advantage computation through torch.compile.

Both are chains of elementwise tensor operations and reductions over [N, T] (the loss) and [B, G]
(the advantages), which Inductor fuses into a few loops. They are compiled with dynamic shapes (the
micro-batch's T and N change from step to step) and without CUDA graphs, so the compiled function is
the same function: tests/test_torch_compile.py checks loss and gradient equal eager to 1e-6. A
setting that changes (a controller moving epsilon) recompiles; past torch's recompile limit the
function runs eagerly, which is still the same result.

Inductor caches the CPU kernels it compiles, and its cache key does not tell apart the vector
instruction sets it compiles for: a kernel compiled for AVX-512, read back by a process whose
PyTorch is capped at AVX2 (``ATEN_CPU_CAPABILITY=avx2``; a cache folder shared by machines of
different CPUs) computes wrong results (measured: a KL of 0.0047 against eager's 0.0057). So the
kernels are kept in a subfolder per instruction set (``inductor_cache_folder``).
"""

from __future__ import annotations

import os
from typing import Callable

import torch

from grpo import core


def inductor_cache_folder() -> str:
    """Inductor's cache folder (``TORCHINDUCTOR_CACHE_DIR``, else its default) narrowed to a subfolder
    named by the vector instruction set Inductor compiles CPU kernels for in this process, and set
    for it: kernels compiled for another set are never read back."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    leaf = "isa-" + ("+".join(str(pick_vec_isa()).split()) or "none")
    base = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir()
    folder = base if os.path.basename(base) == leaf else os.path.join(base, leaf)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    return folder


def compiled(fn: Callable) -> Callable:
    """``fn`` compiled by torch.compile with dynamic shapes (Inductor on CPU and GPU), its kernels
    cached per instruction set (``inductor_cache_folder``)."""
    inductor_cache_folder()
    return torch.compile(fn, dynamic=True, fullgraph=False)


def loss_and_advantage_functions(enabled: bool) -> tuple[Callable, Callable]:
    """(policy_loss, compute_advantages) of grpo.core, compiled when ``enabled``."""
    if not enabled:
        return core.policy_loss, core.compute_advantages
    return compiled(core.policy_loss), compiled(core.compute_advantages)
