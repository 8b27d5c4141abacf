"""Where and how the run's models train: policy and reference on this process's device, bf16
autocast or not, the module the training forward runs through (the policy, its DDP wrapper, or the
policy sharded in place by FSDP2), and whether a group's completions share one prompt pass."""

from __future__ import annotations

from dataclasses import dataclass

from grpo.infra import distributed
from grpo.models import grouped_attention, keep_head_fp32, native_bf16
from grpo.models.packing import SHARED_PREFIX_ATTENTION, sliding_window
from grpo.models.quantization import keep_trainable
from grpo.train.forwards import Forwards


@dataclass(frozen=True)
class PlacementSettings:
    """What placing the models reads; each field is the Config field named in its comment."""

    load_in_4bit: bool  # load_in_4bit: the 4-bit base is loaded onto the device already
    bf16: bool | None  # bf16: autocast (None: where the device has native bf16 and dtype is float32)
    dtype: str  # dtype: the parameters'
    shared_prefix: bool  # shared_prefix: a group's completions share one prompt pass where attention allows
    gradient_checkpointing: bool  # gradient_checkpointing
    strategy: str  # distributed_strategy: ddp or fsdp2
    group_size: int  # num_generations (G)
    max_tokens_per_forward: int  # max_tokens_per_forward
    processing: dict | None = None  # top_k, top_p, min_p, repetition_penalty where the corrections need log q


@dataclass(frozen=True)
class Placement:
    """The result: what the trainer's components run the models through."""

    module: object  # the training forward's module (DDP wrapper, FSDP2-sharded policy, or the policy)
    forwards: Forwards  # layout and precision of every forward over a rollout
    amp: bool  # bf16 autocast of the training forwards
    sharded: bool  # FSDP2: policy and reference sharded across processes


def place_models(policy, reference, world: distributed.World, settings: PlacementSettings) -> Placement:
    """Policy and ``reference`` (or None) onto this process's device, the LM head kept in fp32 under
    autocast, checkpointing switched on, the policy wrapped for DDP or sharded for FSDP2; the
    policy itself stays the model (generation, LoRA switches and saving use it)."""
    s = settings
    keep_trainable(policy)  # a 4-bit policy handed in is guarded as load_models guards its own
    policy.train()
    if world.device.type != "cpu":
        for m in (policy, reference):
            if m is not None and not s.load_in_4bit:  # a 4-bit base loads onto the device
                m.to(world.device)
    device = next(policy.parameters()).device
    amp = s.bf16 if s.bf16 is not None else (native_bf16(device) and s.dtype == "float32")
    if amp:
        for m in (policy, reference):
            if m is not None:
                keep_head_fp32(m)
    attn = getattr(policy.config, "_attn_implementation", None)
    # else one sequence per row; a custom mask would also replace a model's sliding-window mask
    share = s.shared_prefix and attn in SHARED_PREFIX_ATTENTION and sliding_window(policy.config) is None
    if s.gradient_checkpointing:
        policy.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        if share and attn == "sdpa":  # the backward's recompute looks the attention function up in the
            # config: it must find the grouped one there too, not only inside the training forward
            policy.config._attn_implementation = grouped_attention.register()
    module = distributed.wrap_policy(policy, world, s.strategy)
    sharded = world.distributed and s.strategy == "fsdp2"
    if sharded and reference is not None:
        distributed.shard(reference)
    forwards = Forwards(group_size=s.group_size, share_prompt=share, attn_implementation=attn or "sdpa",
                        autocast=amp, max_tokens=s.max_tokens_per_forward, sharded=sharded,
                        tied_grad_in_place=not world.distributed, processing=s.processing)
    return Placement(module=module, forwards=forwards, amp=amp, sharded=sharded)
