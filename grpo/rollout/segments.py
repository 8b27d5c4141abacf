"""Sampling that records which policy version drew each token, with partial rollouts.

Without partial rollouts a sampling call runs under one set of weights: every token of its rows
carries the version loaded when the call started, and new weights wait for the next call. With
partial rollouts (verl's partial rollout, NeMo-RL's in-flight weight updates) the call decodes in
segments of ``segment_tokens`` tokens; between segments the newest weights are loaded and the rows
still decoding continue under them from their exact token ids so far (the engine prefills the prompt
and the partial completion again), so one row may hold tokens of several versions. Each token keeps
the sampling log-prob of the version that drew it, which the importance correction compares with
the trainer's.

Dimension letters: N sequences, T completion tokens, P prompt tokens.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import torch

from grpo.rollout.types import Rollout, eos_token_ids, finish_rollout
from grpo.rollout.engine import RolloutEngine, SamplingSettings
from grpo.rollout.keys import _mix64


def segment_key(key: int, segment: int) -> int:
    """The sampling key of a row's ``segment``-th continuation (segment 0: the row's own key)."""
    return key if segment == 0 else _mix64((key * 1_000_033 + segment) % 2**64) % 2**62


def sample_versioned(engine: RolloutEngine, prompts: list, *, group_size: int, sampling: SamplingSettings,
                     keys: list[int] | None, with_logprobs: bool, greedy: bool = False, segment_tokens: int = 0,
                     refresh: Callable[[], int]) -> Rollout:
    """``engine.generate``'s Rollout with ``versions`` [N, T]: the version ``refresh()`` returned (it
    loads the newest weights first) when the segment that drew each token started. ``segment_tokens``
    0 (or at least max_new_tokens): one segment, rows finish under the weights they started with."""
    version = refresh()
    n_new = sampling.max_new_tokens
    if segment_tokens <= 0 or segment_tokens >= n_new or greedy:
        ro = engine.generate(prompts, group_size=group_size, sampling=sampling, keys=keys,
                             with_logprobs=with_logprobs, greedy=greedy)
        return dataclasses.replace(ro, versions=torch.full_like(ro.completion_ids, version))
    start = time.perf_counter()
    first = engine.generate(prompts, group_size=group_size, sampling=dataclasses.replace(sampling, max_new_tokens=segment_tokens),
                            keys=keys, with_logprobs=with_logprobs)
    n = first.completion_ids.shape[0]
    lengths = first.lengths.tolist()
    ids = [first.completion_ids[r, :lengths[r]].tolist() for r in range(n)]
    logps = [first.sampling_logp[r, :lengths[r]].tolist() if first.sampling_logp is not None else [] for r in range(n)]
    vers = [[version] * lengths[r] for r in range(n)]
    prompt_rows = [first.prompt_ids[r][first.prompt_mask[r].bool()].tolist() for r in range(n)]
    live = [r for r in range(n) if bool(first.truncated[r])]  # no EOS yet
    segment = 1
    while live and len(ids[live[0]]) < n_new:  # every live row has drawn the same number of tokens
        version = refresh()
        todo = min(segment_tokens, n_new - len(ids[live[0]]))
        settings = dataclasses.replace(sampling, max_new_tokens=todo, max_prompt_length=sampling.max_prompt_length + n_new)
        ro = engine.generate([prompt_rows[r] + ids[r] for r in live], group_size=1, sampling=settings,
                             keys=None if keys is None else [segment_key(keys[r], segment) for r in live],
                             with_logprobs=with_logprobs)
        still = []
        for j, r in enumerate(live):
            k = int(ro.lengths[j])
            ids[r] += ro.completion_ids[j, :k].tolist()
            if ro.sampling_logp is not None:
                logps[r] += ro.sampling_logp[j, :k].tolist()
            vers[r] += [version] * k
            if bool(ro.truncated[j]):
                still.append(r)
        live, segment = still, segment + 1
    return _assemble(engine, first, ids, logps if with_logprobs else None, vers, seconds=time.perf_counter() - start)


def _assemble(engine: RolloutEngine, first: Rollout, ids: list[list[int]], logps: list[list[float]] | None,
              vers: list[list[int]], *, seconds: float) -> Rollout:
    """The rows' whole completions as one Rollout (the prompts of the first segment)."""
    n, t = len(ids), max((len(x) for x in ids), default=0)
    pad = engine.tokenizer.pad_token_id
    device = first.completion_ids.device
    comp = torch.full((n, t), pad, dtype=torch.long, device=device)  # [N, T]
    logp = torch.zeros(n, t, device=device) if logps is not None else None  # [N, T]
    versions = torch.zeros(n, t, dtype=torch.long, device=device)  # [N, T]
    for r in range(n):
        k = len(ids[r])
        comp[r, :k] = torch.tensor(ids[r], dtype=torch.long)
        versions[r, :k] = torch.tensor(vers[r], dtype=torch.long)
        if logp is not None:
            logp[r, :k] = torch.tensor(logps[r])
    eos = eos_token_ids(engine.model, engine.tokenizer)
    ro = finish_rollout(engine.tokenizer, first.prompt_ids, first.prompt_mask, comp, eos, sampling_logp=logp,
                        engine=first.engine, seconds=seconds, prompts_truncated=first.prompts_truncated)
    return dataclasses.replace(ro, versions=versions)
