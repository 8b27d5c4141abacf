"""Samplers: turn prompts into groups of completions (the Rollout of one step)."""

from grpo.rollout.base import Rollout, completion_mask_from_ids
from grpo.rollout.hf import generate_rollout

__all__ = ["Rollout", "completion_mask_from_ids", "generate_rollout"]
