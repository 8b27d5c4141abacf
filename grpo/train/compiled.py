"""torch_compile: the policy loss and the advantage computation through torch.compile.

Both are chains of elementwise tensor operations and reductions over [N, T] (the loss) and [B, G]
(the advantages), which Inductor fuses into a few loops. They are compiled with dynamic shapes (the
micro-batch's T and N change from step to step) and without CUDA graphs, so the compiled function is
the same function: tests/test_torch_compile.py checks loss and gradient equal eager to 1e-6. A
setting that changes (a controller moving epsilon) recompiles; past torch's recompile limit the
function runs eagerly, which is still the same result.
"""

from __future__ import annotations

from typing import Callable

import torch

from grpo import core


def compiled(fn: Callable) -> Callable:
    """``fn`` compiled by torch.compile with dynamic shapes (Inductor on CPU and GPU)."""
    return torch.compile(fn, dynamic=True, fullgraph=False)


def loss_and_advantage_functions(enabled: bool) -> tuple[Callable, Callable]:
    """(policy_loss, compute_advantages) of grpo.core, compiled when ``enabled``."""
    if not enabled:
        return core.policy_loss, core.compute_advantages
    return compiled(core.policy_loss), compiled(core.compute_advantages)
