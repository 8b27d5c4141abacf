"""The consistency probe: how much the rewards of G samples of one prompt vary, on fixed prompts."""

from __future__ import annotations

import torch

from grpo import core
from grpo.data import render_prompt
from grpo.rollout import generate_rollout


@torch.no_grad()
def consistency(model, tokenizer, samples: list[dict], rewards, *, system_prompt: str, group_size: int,
                max_new_tokens: int, temperature: float, top_p: float, top_k: int, max_prompt_length: int,
                synced: bool = False) -> dict:
    """For ``samples`` (fixed prompts), sample ``group_size`` completions each, score them with
    ``rewards`` (a RewardRunner) and report the mean coefficient of variation of their rewards."""
    prompts = [render_prompt(tokenizer, s["prompt"], system_prompt) for s in samples]
    ro = generate_rollout(model, tokenizer, prompts, group_size=group_size, max_new_tokens=max_new_tokens,
                          temperature=temperature, top_p=top_p, top_k=top_k, max_prompt_length=max_prompt_length,
                          with_logprobs=False, synced=synced)
    res = rewards.score(ro.texts, [s for s in samples for _ in range(group_size)])
    r = torch.nan_to_num(res.total.float(), nan=0.0).view(len(samples), group_size)  # [b, G]
    return {"consistency_cv": float(core.reward_cv(r).mean()), "consistency_reward_mean": float(r.mean())}
