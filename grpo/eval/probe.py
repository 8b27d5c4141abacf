"""The consistency probe: how much the rewards of G samples of one prompt vary, on fixed prompts."""

from __future__ import annotations

import random

import torch

from grpo import core
from grpo.data import render_prompt
from grpo.rollout import RolloutEngine, SamplingSettings


@torch.no_grad()
def consistency(engine: RolloutEngine, samples: list[dict], rewards, *, system_prompt: str, group_size: int,
                sampling: SamplingSettings) -> dict:
    """For ``samples`` (fixed prompts), sample ``group_size`` completions each with ``engine``
    (unkeyed, from the global RNG), score them with ``rewards`` (a RewardRunner) and report the mean
    coefficient of variation of their rewards."""
    prompts = [render_prompt(engine.tokenizer, s["prompt"], system_prompt) for s in samples]
    ro = engine.generate(prompts, group_size=group_size, sampling=sampling)
    res = rewards.score(ro.texts, [s for s in samples for _ in range(group_size)],
                        completion_ids=ro.completion_id_lists())
    r = torch.nan_to_num(res.total.float(), nan=0.0).view(len(samples), group_size)  # [b, G]
    return {"consistency_cv": float(core.reward_cv(r).mean()), "consistency_reward_mean": float(r.mean())}


def probe_prompts(pool: list[dict], count: int, *, randomly: bool, seed: int, step: int) -> list[dict]:
    """The probe's prompts: the first ``count`` of ``pool``, or (seed 003 section 3.4) ``count`` drawn
    at random at each probe, from a generator of (seed, step) alone, so a resumed run probes the same."""
    if not randomly or count >= len(pool):
        return pool[:count]
    return random.Random(seed * 1_000_003 + step).sample(pool, count)
