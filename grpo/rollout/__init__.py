"""Samplers: turn prompts into groups of completions (the Rollout of one step)."""

from grpo.rollout.base import Rollout, completion_mask_from_ids
from grpo.rollout.fast import fast_rollout, fast_unsupported_reason
from grpo.rollout.hf import generate_rollout

ROLLOUT_BACKENDS = {"hf": generate_rollout, "fast": fast_rollout}


def resolve_backend(name: str, model, *, synced: bool = False, rows: int | None = None, group_size: int = 1,
                    kernels: str = "auto") -> str:
    """The backend that runs for config value ``name``. auto: fast where the model supports it
    (decoder-only, a checked architecture, not synced FSDP2 generation) and, given the step's
    ``rows``, where its decode step measured no slower than generate's (grpo.rollout.choice), else hf."""
    if name == "auto":
        if fast_unsupported_reason(model, synced=synced) is not None:
            return "hf"
        if rows is None:
            return "fast"
        from grpo.rollout.choice import fast_or_hf
        return fast_or_hf(model, rows=rows, group_size=group_size, kernels=kernels)
    if name not in ROLLOUT_BACKENDS:
        raise ValueError(f"rollout_backend: unknown {name!r}; valid: auto, {', '.join(ROLLOUT_BACKENDS)}")
    return name


def sample_rollout(backend: str, model, tokenizer, prompts: list[str], *, kernels: str = "auto", **kwargs) -> Rollout:
    """``generate_rollout``'s arguments, run by the backend ``resolve_backend`` picks for ``backend``;
    ``kernels``: the fast backend's ``decode_kernels``."""
    g = kwargs["group_size"]
    name = resolve_backend(backend, model, synced=kwargs.get("synced", False), rows=len(prompts) * g, group_size=g,
                           kernels=kernels)
    if name == "fast":
        kwargs["kernels"] = kernels
    return ROLLOUT_BACKENDS[name](model, tokenizer, prompts, **kwargs)


__all__ = ["ROLLOUT_BACKENDS", "Rollout", "completion_mask_from_ids", "fast_rollout", "generate_rollout",
           "resolve_backend", "sample_rollout"]
