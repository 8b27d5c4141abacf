"""The optimizer, its learning-rate schedule, and the one optimizer step every model of a run takes
(policy and critic): clip the gradient norm, step only when it is finite."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def adamw(params: list, **settings) -> torch.optim.AdamW:
    """AdamW over ``params``, with PyTorch's fused kernel where every parameter is a float tensor on
    the CPU or a GPU: the same update (to fp32 rounding) in one pass over each tensor, where the
    default foreach path makes several (a full fine-tune of SmolLM2-135M on the 2-core CPU: 0.11 s
    per optimizer step against 0.45 s)."""
    params = list(params)
    fused = bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(params, fused=fused or None, **settings)


@dataclass(frozen=True)
class Schedule:
    """The learning-rate schedule, counted in training steps as max_steps is (the Config fields of
    the same names)."""

    lr_scheduler_type: str  # constant, cosine or linear (to 0 at max_steps), after the warmup
    warmup_steps: int  # training steps of linear warmup from 0
    max_steps: int  # the run's training steps


def lr_lambda(schedule: Schedule, per_step: int):
    """Multiplier of learning_rate at a given optimizer step: linear warmup, then the schedule. Both
    are counted in training steps, each taking ``per_step`` optimizer steps (num_iterations x
    mini_batches)."""
    total = max(1, schedule.max_steps * per_step)
    warm = schedule.warmup_steps * per_step

    def f(step: int) -> float:
        if step < warm:
            return (step + 1) / (warm + 1)
        progress = (step - warm) / max(1, total - warm)
        if schedule.lr_scheduler_type == "cosine":
            return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
        if schedule.lr_scheduler_type == "linear":
            return max(0.0, 1 - progress)
        return 1.0

    return f


def clipped_step(params: list, optimizer, *, max_grad_norm: float) -> float:
    """Clip the gradient norm of ``params`` to ``max_grad_norm`` (0: no clipping) and step the
    optimizer if the norm is finite; a non-finite gradient never reaches the weights. The gradients
    are freed either way (set to None), so no model-sized gradient waits beside the next rollout.
    Returns the norm before clipping (FSDP2: of the whole model, every process alike)."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm > 0 else float("inf"))
    norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # FSDP2: a DTensor
    if math.isfinite(norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm


def epoch_steps(epochs: float, train_prompts: int, prompts_per_step: int) -> int:
    """Steps of ``epochs`` passes over ``train_prompts`` prompts drawn ``prompts_per_step`` a step (the
    last step of a pass may start the next: the prompt stream is an endless shuffled sequence)."""
    return max(1, math.ceil(epochs * train_prompts / prompts_per_step))
