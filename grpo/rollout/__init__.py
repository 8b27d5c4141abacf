"""Samplers: turn prompts into groups of completions (the Rollout of one step).

``ROLLOUT_ENGINES`` names every engine a ``rollout_engine`` value can build: hf (transformers
``generate``), fast (our decode loop) and auto (whichever measured faster, per call shape).
"""

from grpo.rollout.types import Rollout, completion_mask_from_ids
from grpo.rollout.engine import ROLLOUT_ENGINES, RolloutEngine, SamplingSettings, engine_class, make_engine
from grpo.rollout.hf import HFEngine, generate_rollout
from grpo.rollout.fast import FastEngine, fast_rollout, fast_unsupported_reason
from grpo.rollout.choice import AutoEngine, resolve_engine
from grpo.rollout.vllm.colocated import VLLMColocatedEngine
from grpo.rollout.vllm.client import VLLMServerEngine

__all__ = ["ROLLOUT_ENGINES", "AutoEngine", "FastEngine", "HFEngine", "VLLMColocatedEngine", "VLLMServerEngine", "Rollout", "RolloutEngine", "SamplingSettings",
           "completion_mask_from_ids", "engine_class", "fast_rollout", "fast_unsupported_reason", "generate_rollout",
           "make_engine", "resolve_engine"]
