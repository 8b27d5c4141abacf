"""Samplers: turn prompts into groups of completions (the Rollout of one step)."""

from grpo.rollout.base import Rollout, completion_mask_from_ids
from grpo.rollout.fast import fast_rollout, fast_unsupported_reason
from grpo.rollout.hf import generate_rollout

ROLLOUT_BACKENDS = {"hf": generate_rollout, "fast": fast_rollout}


def resolve_backend(name: str, model, *, synced: bool = False) -> str:
    """The backend that runs for config value ``name``: auto picks fast where the model supports it
    (decoder-only, a checked architecture, not synced FSDP2 generation), else hf."""
    if name == "auto":
        return "fast" if fast_unsupported_reason(model, synced=synced) is None else "hf"
    if name not in ROLLOUT_BACKENDS:
        raise ValueError(f"rollout_backend: unknown {name!r}; valid: auto, {', '.join(ROLLOUT_BACKENDS)}")
    return name


def sample_rollout(backend: str, model, tokenizer, prompts: list[str], **kwargs) -> Rollout:
    """``generate_rollout``'s arguments, run by the backend ``resolve_backend`` picks for ``backend``."""
    name = resolve_backend(backend, model, synced=kwargs.get("synced", False))
    return ROLLOUT_BACKENDS[name](model, tokenizer, prompts, **kwargs)


__all__ = ["ROLLOUT_BACKENDS", "Rollout", "completion_mask_from_ids", "fast_rollout", "generate_rollout",
           "resolve_backend", "sample_rollout"]
