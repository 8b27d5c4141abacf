"""Scale-out on PyTorch's own engine: torchrun sets the environment, this module does the rest.

``torchrun --nproc-per-node N -m grpo train ...`` starts N copies of the trainer; each reads RANK,
WORLD_SIZE and LOCAL_RANK, joins one process group (gloo on CPU, NCCL on GPU) and wraps the policy
in DDP or FSDP2 (``fully_shard``). Work is divided by prompt: every rank draws the same global list
of B prompts and keeps its own B / world contiguous slice, so each group of G completions lives on
one rank and group statistics need no communication. Batch-level quantities (rewards for the
batch-std estimator and the metrics, the token-mean normaliser, token-weighted metric sums) are
all-gathered or all-reduced. Without torchrun ``World()`` is a single process and every helper here
is the identity, so one code path serves both.

Dimension letters: B prompts per step (global), b = B / world per rank, G group size.
"""

from __future__ import annotations

import gc
import os
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

@dataclass(frozen=True)
class World:
    """This process's place among the run's. ``group``: the process group the helpers below talk over
    (None: torchrun's default group); a thread that communicates beside the trainer's main thread has a
    group of its own (``side_world``), since collectives of one group must come in the same order on
    every process."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    group: object = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def init_world() -> World:
    """The process group torchrun's environment describes, or a single process without one."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:  # one process: the first GPU when there is one
        return World(device=torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"))
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", gpu_index(local_rank, torch.cuda.device_count()))
        torch.cuda.set_device(device)
        backend = "cpu:gloo,cuda:nccl"  # rewards and metric sums are CPU tensors; NCCL is CUDA-only
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    return World(rank=rank, size=size, local_rank=local_rank, device=device)


def side_world(world: World) -> World:
    """The same processes over a gloo process group of their own, for the collectives of a thread that
    runs beside the main thread (asynchronous rollouts' producer and scorer, whose counts and rewards
    are CPU tensors): each group orders its own collectives, and no NCCL communicator is made for it.
    Collective: every process calls it, in the same order. One process: the world itself."""
    if not world.distributed:
        return world
    return World(rank=world.rank, size=world.size, local_rank=world.local_rank, device=world.device,
                 group=dist.new_group(backend="gloo"))


def gpu_index(local_rank: int, visible: int) -> int:
    """The GPU this process trains on: its local rank among the visible GPUs, or the only one it sees
    (a launcher that binds one GPU to each process through CUDA_VISIBLE_DEVICES)."""
    if visible == 1:
        return 0
    if local_rank >= visible:
        raise RuntimeError(f"LOCAL_RANK {local_rank}: only {visible} GPUs visible; start at most one process per "
                           "GPU, or hide the GPUs (CUDA_VISIBLE_DEVICES=) to train on CPUs")
    return local_rank


def close_world(world: World, *, finished: bool) -> None:
    """Leave the process group. After a run every rank finished, the ranks first meet at a barrier, so
    none tears its connections down while another is still inside a collective; after an error there
    is no barrier (the other ranks may never arrive). The group is then destroyed and collected while
    the interpreter is fully alive: a gloo worker thread that frees its last tensors during interpreter
    shutdown aborts the process ("terminate called without an active exception"). Callers drop what
    holds the group first (FSDP2's modules keep a reference to it)."""
    if world.distributed and dist.is_initialized():
        if finished:
            dist.barrier()
        dist.destroy_process_group()
        gc.collect()


def wrap_policy(model: torch.nn.Module, world: World, strategy: str) -> torch.nn.Module:
    """The module the training forward runs through: the model itself on one process, DDP, or the
    model sharded in place with FSDP2 (each decoder layer, then the root)."""
    if not world.distributed:
        return model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [world.device.index] if world.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)
    shard(model)
    return model


def shard(model: torch.nn.Module) -> None:
    """FSDP2: shard each transformer block, then the rest, in place. Used for the policy and, the same
    way, the frozen reference (which then never needs the whole model on one device). A LoRA policy's
    root is its transformers model, not the PEFT wrapper: ``generate`` calls that model directly (PEFT's
    ``generate`` goes to the base model), so its forward must be the one that gathers the shards; the
    wrapper reaches the root's methods (``set_requires_gradient_sync``) through its attribute look-up."""
    from torch.distributed.fsdp import fully_shard

    for block in _blocks(model):
        fully_shard(block)
    fully_shard(model.get_base_model() if hasattr(model, "get_base_model") else model)


def _blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated decoder layers: the largest ModuleList of the model (layers of a Llama/Qwen/GPT)."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


def gather_rows(x: torch.Tensor, world: World) -> torch.Tensor:
    """Concatenate each rank's rows in rank order: [b, ...] per rank -> [B, ...] on every rank.
    Every rank must hold the same number of rows."""
    if not world.distributed:
        return x
    parts = [torch.empty_like(x) for _ in range(world.size)]
    dist.all_gather(parts, x.contiguous(), group=world.group)
    return torch.cat(parts)


def gather_objects(obj, world: World) -> list:
    """One picklable object per rank, in rank order, on every rank."""
    if not world.distributed:
        return [obj]
    out = [None] * world.size
    dist.all_gather_object(out, obj, group=world.group)
    return out


def all_sum(x: torch.Tensor, world: World) -> torch.Tensor:
    """Sum over ranks (a new tensor; the input is left as it was)."""
    if not world.distributed:
        return x
    y = x.detach().clone()
    dist.all_reduce(y, group=world.group)
    return y


def average_grads(params, world: World) -> None:
    """Each parameter's gradient replaced by its mean over ranks (a module outside DDP and FSDP2, such
    as the shared-trunk critic's value head)."""
    if not world.distributed:
        return
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad, group=world.group)
            p.grad /= world.size


def all_max(value: int, world: World) -> int:
    if not world.distributed:
        return value
    t = torch.tensor([value], dtype=torch.long)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=world.group)
    return int(t)


def broadcast_object(obj, world: World):
    """Rank 0's object on every rank."""
    if not world.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=world.group)
    return box[0]


def barrier(world: World) -> None:
    if world.distributed:
        dist.barrier(group=world.group)


def full_optimizer_state(model: torch.nn.Module, optimizer) -> dict:
    """The optimizer state keyed by parameter name and unsharded, as one process would hold it, so a
    checkpoint resumes on any number of processes. Collective under FSDP2: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True,
                                                                                   cpu_offload=True))


def load_full_optimizer_state(model: torch.nn.Module, optimizer, state: dict) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def full_model_state(model: torch.nn.Module) -> dict:
    """Unsharded CPU copies of a sharded model's weights (collective under FSDP2)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_model_state(model: torch.nn.Module, state: dict) -> None:
    """Each rank keeps its own shard of the full tensors in ``state``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=False))


@contextmanager
def grad_sync(module: torch.nn.Module, world: World, *, enabled: bool):
    """Gradient accumulation without communication: inside ``enabled=False`` the backward keeps its
    gradients local (DDP ``no_sync``, FSDP2 ``set_requires_gradient_sync(False)``); the last
    micro-batch of a step syncs everything accumulated."""
    if enabled or not world.distributed:
        yield
        return
    if hasattr(module, "no_sync"):  # DDP
        with module.no_sync():
            yield
        return
    if not hasattr(module, "set_requires_gradient_sync"):  # a module outside DDP and FSDP2 syncs nothing
        yield
        return
    module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)
