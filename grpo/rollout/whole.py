"""A policy's whole weights, for a sampler that holds a copy of them: the engine process of
asynchronous rollouts (rollout/producer.py), and ``ReplicaEngine``, which samples a policy FSDP2
shards from a whole copy on each process.

``whole_weights`` gives each parameter as an unsharded, unquantized model holds it: an FSDP2 shard
gathered from every process (a collective), a QLoRA 4-bit base weight dequantized by bitsandbytes'
own dequantization (the values the 4-bit layer multiplies by). ``replica_model`` builds the model
they load into: the policy's architecture, unquantized, with its LoRA adapters.
"""

from __future__ import annotations

import copy

import torch

from grpo.rollout.engine import RolloutEngine, SamplingSettings, engine_class, make_engine
from grpo.rollout.types import Rollout, rollout_to


def _dequantized(p: torch.Tensor, state) -> torch.Tensor:
    """``p`` unquantized: a 4-bit (QLoRA) weight with its bitsandbytes ``state`` dequantized to its
    original dtype, any other as it is."""
    if state is None:
        return p
    import bitsandbytes.functional as bnb_f

    with torch.no_grad():
        return bnb_f.dequantize_4bit(p.data, state).to(state.dtype)


def _gathered(p: torch.Tensor) -> torch.Tensor:
    """``p`` whole: one FSDP2 shards (a DTensor) gathered from every process, any other as it is."""
    from torch.distributed.tensor import DTensor

    if isinstance(p, DTensor):
        with torch.no_grad():
            return p.full_tensor()
    return p


def whole_weights(model, names=None) -> dict[str, torch.Tensor]:
    """The policy's parameters (only ``names``, where given; each once, as ``named_parameters`` gives
    them) whole and unquantized, in CPU memory. A collective where FSDP2 shards them: every process calls it at the
    same point of its main thread. A 4-bit weight's state is its own, or its layer's where FSDP2
    replaced the weight by its shards (bitsandbytes keeps a copy on the layer)."""
    out, seen = {}, set()
    for prefix, module in model.named_modules():
        for key, p in module.named_parameters(recurse=False):
            name = f"{prefix}.{key}" if prefix else key
            if id(p) in seen or (names is not None and name not in names):
                continue
            seen.add(id(p))
            state = getattr(p, "quant_state", None)
            if state is None and key == "weight":
                state = getattr(module, "quant_state", None)
            out[name] = _dequantized(_gathered(p), state).cpu()  # one at a time off the accelerator
    return out


def architecture(model):
    """The policy's model config as a replica is built from it: unquantized."""
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    return config


def lora_config(model):
    """The LoRA config of a PEFT policy (its active adapter's), else None."""
    configs = getattr(model, "peft_config", None)
    return None if not configs else configs[getattr(model, "active_adapter", "default")]


def replica_model(model_config, dtype, peft_config):
    """A model of the policy's architecture (``architecture``; its LoRA adapters too: ``lora_config``),
    weights to come."""
    from transformers import AutoModelForCausalLM

    attn = getattr(model_config, "_attn_implementation", None)
    model = AutoModelForCausalLM.from_config(model_config, dtype=dtype, attn_implementation=attn)
    if peft_config is not None:
        from peft import get_peft_model

        model = get_peft_model(model, peft_config)
    return model.eval()


class ReplicaEngine(RolloutEngine):
    """The engine ``inner`` (a registered name) on a whole copy of a policy that FSDP2 shards, so each
    process samples its own prompts without the others (the fast decode loop cannot run FSDP2's
    synced generate). The copy gets the gathered weights at construction and at each ``sync_weights``
    (after each optimizer step): a collective, which the trainer's processes make together. It costs
    one whole copy of the weights in each process's CPU memory, where the copy samples (and, while a
    full fine-tune's weights are copied in, a second one); its rollouts go to the policy's device."""

    name = "replica"

    def __init__(self, model, tokenizer, *, inner: str, kernels: str = "auto", options=None):
        super().__init__(model, tokenizer)
        cls = engine_class(inner)
        self.same_tokens_for_keys, self.returns_sampling_logprobs = cls.same_tokens_for_keys, cls.returns_sampling_logprobs
        self.own_kernels, self.supports_stop = cls.own_kernels, cls.supports_stop
        self.device = next(model.parameters()).device
        weights = whole_weights(model)
        dtype = next(iter(weights.values())).dtype if weights else torch.float32
        self.replica = replica_model(architecture(model), dtype, lora_config(model))
        self._load(weights)
        self.inner = make_engine(inner, self.replica, tokenizer, kernels=kernels, options=options)

    def _load(self, weights: dict[str, torch.Tensor]) -> None:
        mine = dict(self.replica.named_parameters())
        with torch.no_grad():
            for name, value in weights.items():
                mine[name].copy_(value)

    def _generate(self, prompts, *, group_size: int, sampling: SamplingSettings, keys: list[int] | None,
                  with_logprobs: bool, greedy: bool, **extra) -> Rollout:
        ro = self.inner.generate(prompts, group_size=group_size, sampling=sampling, keys=keys,
                                 with_logprobs=with_logprobs, greedy=greedy, **extra)
        return rollout_to(ro, self.device)  # where the policy trains (the copy samples on the CPU)

    def sync_weights(self, policy) -> None:
        """The policy's current weights gathered into the copy (the trainable ones: the frozen rest
        cannot have changed), then the inner engine told."""
        if policy is not self.model:
            raise ValueError("rollout engine 'replica' samples a copy of the model it was built on; "
                             "sync_weights got another one")
        trainable = {name for name, p in policy.named_parameters() if p.requires_grad}
        self._load(whole_weights(policy, trainable))
        self.inner.sync_weights(self.replica)

    def close(self) -> None:
        self.inner.close()
        super().close()
