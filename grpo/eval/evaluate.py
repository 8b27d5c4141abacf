"""Held-out evaluation: greedy accuracy and unbiased pass@k, used by `grpo eval` and inside `train`."""

from __future__ import annotations

import math
import time

import torch

from grpo.agent import AgentSampler, episode_metrics
from grpo.data import render_prompt
from grpo.rewards import score_completions
from grpo.rollout import Rollout, RolloutEngine, SamplingSettings


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n - c, k) / C(n, k) for c correct of n samples."""
    if k > n:
        raise ValueError(f"pass@k needs k <= n samples, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _verify(ro: Rollout, samples: list[dict], verifier) -> list[float]:
    """The verifier's value of each completion of ``ro`` (NaN where it failed or returned None, which
    counts as wrong); an episode's transcript and counts are beside its sample."""
    return score_completions(ro.texts, samples, {"verifier": verifier}, episodes=ro.episodes,
                             completion_ids=ro.completion_id_lists()).per_reward["verifier"].tolist()


def _correct(ro: Rollout, samples: list[dict], verifier) -> list[bool]:
    return [bool(v >= 1.0) for v in _verify(ro, samples, verifier)]


@torch.no_grad()
def evaluate(engine: RolloutEngine, samples: list[dict], verifier, *, system_prompt: str, max_new_tokens: int,
             batch_size: int = 64, pass_k: int = 0, pass_prompts: int = 0, temperature: float = 1.0,
             top_p: float = 1.0, top_k: int = 0, max_prompt_length: int = 1024,
             agent: AgentSampler | None = None) -> dict:
    """Greedy accuracy on every sample; pass@k from k samples per prompt on the first ``pass_prompts``,
    both sampled by ``engine`` (pass@k unkeyed, from the global RNG).

    A completion is correct when ``verifier(completion, sample) >= 1`` (the task's first reward).
    Returns {"accuracy", "pass@k" (or None), "k", "n_prompts", "mean_length", "truncated_share",
    "prompts_truncated" (prompts cut from the left to ``max_prompt_length``), "seconds", "examples"
    (a few prompts with their greedy completion and its verifier value, "reward")}. With ``agent``
    (tools / an environment) every completion is a multi-turn episode, graded on its final answer
    with its transcript beside the sample, and the result holds the episodes' tool metrics ("tools").
    """
    start = time.perf_counter()
    sampling = SamplingSettings(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                                max_prompt_length=max_prompt_length)
    prompts = [render_prompt(engine.tokenizer, s["prompt"], system_prompt) for s in samples]
    correct, lengths, truncated, examples, n_cut, infos = [], [], [], [], 0, []

    def generate(lo: int, hi: int, group_size: int, greedy: bool):
        rows = [s for s in samples[lo:hi] for _ in range(group_size)]
        if agent is None:
            return engine.generate(prompts[lo:hi], group_size=group_size, sampling=sampling, greedy=greedy), rows
        return agent.generate(engine, samples[lo:hi], group_size=group_size, sampling=sampling,
                              system_prompt=system_prompt, greedy=greedy), rows

    for i in range(0, len(samples), batch_size):
        ro, rows = generate(i, i + batch_size, 1, True)
        infos += ro.episodes or []
        values = _verify(ro, rows, verifier)
        correct += [bool(v >= 1.0) for v in values]
        lengths += ro.lengths.tolist()
        truncated += ro.truncated.tolist()
        n_cut += ro.prompts_truncated
        examples += [{"prompt": samples[i + j]["prompt"], "answer": samples[i + j].get("answer"), "completion": t,
                      "reward": None if math.isnan(values[j]) else values[j]}
                     for j, t in enumerate(ro.texts[:2])] if len(examples) < 6 else []
    result = {"accuracy": sum(correct) / max(len(correct), 1), "n_prompts": len(samples),
              "mean_length": sum(lengths) / max(len(lengths), 1),
              "truncated_share": sum(truncated) / max(len(truncated), 1), "pass@k": None, "k": pass_k,
              "prompts_truncated": n_cut}
    if pass_k and pass_prompts:
        sub = samples[:pass_prompts]
        per_batch = max(1, batch_size // pass_k)
        scores = []
        for i in range(0, len(sub), per_batch):
            ro, rows = generate(i, min(i + per_batch, len(sub)), pass_k, False)
            ok = _correct(ro, rows, verifier)
            scores += [pass_at_k(pass_k, sum(ok[j:j + pass_k]), pass_k) for j in range(0, len(ok), pass_k)]
        result["pass@k"] = sum(scores) / len(scores)
        result["pass_prompts"] = len(sub)
    if agent is not None:
        result["tools"] = episode_metrics(infos)
    result["seconds"] = time.perf_counter() - start
    result["examples"] = examples
    return result


def evaluate_as_configured(engine: RolloutEngine, samples: list[dict], verifier, cfg,
                           agent: AgentSampler | None = None) -> dict:
    """``evaluate`` with a run config's evaluation settings (eval_max_new_tokens, eval_batch_size,
    eval_pass_k on the first eval_pass_prompts, the sampling warpers, max_prompt_length, the system
    prompt): the one place a config becomes evaluation settings, for the trainer and ``grpo eval``."""
    return evaluate(engine, samples, verifier, system_prompt=cfg.system_prompt, max_new_tokens=cfg.eval_max_new_tokens,
                    batch_size=cfg.eval_batch_size, pass_k=cfg.eval_pass_k,
                    pass_prompts=min(cfg.eval_pass_prompts, len(samples)), temperature=cfg.temperature,
                    top_p=cfg.top_p, top_k=cfg.top_k, max_prompt_length=cfg.max_prompt_length, agent=agent)
