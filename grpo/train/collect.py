"""Collection: this step's prompts sampled, scored and, with DAPO's dynamic sampling, filtered to the
groups that carry a signal.

Dimension letters: B prompts, G group size, N = B*G sequences (n on this process), T completion tokens.
"""

from __future__ import annotations

import dataclasses

import torch

from grpo import core
from grpo.infra import distributed as dist_io
from grpo.rollout import Rollout
from grpo.rollout.base import concat_rollouts, rollout_to, select_rollout


def dynamic_sample(trainer) -> tuple[list[dict], Rollout, torch.Tensor, dict]:
    """DAPO dynamic sampling (arXiv 2503.14476, section 3.2): sample and score rounds of B prompts, keep
    only groups whose rewards are not all equal, until B groups are kept or ``dynamic_sampling_rounds``
    rounds are spent. Returns this process's (samples, rollout), the step's rewards [b', G] and the
    metrics, b' <= B kept groups. When no round kept a group the last round is trained as it is (its
    groups have zero advantage, so only the KL term acts) and dynamic_sampling_empty is 1.

    On several processes the kept groups are the same as on one, in the same order (the first
    informative groups of each round, by their index in the step's draw); each process then trains
    an equal, contiguous share of them (groups move between processes as CPU tensors), so DDP and
    FSDP2 see the same number of sequences everywhere. A remainder that would not fill every process's
    mini-batches alike (fewer groups than processes x mini_batches), possible only when the rounds run
    out, is left out of the step (counted as dropped), on one process as on several."""
    cfg, world, g, n = trainer.cfg, trainer.world, trainer.cfg.num_generations, trainer.cfg.prompts_per_step
    b = n // world.size  # prompts per process and round
    mine, kept_rewards, n_kept, seconds = [], [], 0, 0.0
    for round in range(cfg.dynamic_sampling_rounds):
        samples, ro = trainer.sample(round)  # fresh sampling keys each round
        rewards, metrics = trainer.score(samples, ro)  # [B, G] of the whole step
        seconds += ro.seconds
        idx = core.informative_groups(rewards).nonzero().flatten()[: n - n_kept]  # [k] indices into the step's B
        kept_rewards.append(rewards[idx])  # [k, G]
        n_kept += len(idx)
        for i in idx.tolist():  # this process's kept groups: (round, index, sample, its G rows)
            j = i - world.rank * b
            if 0 <= j < b:
                rows = select_rollout(ro, torch.arange(j * g, (j + 1) * g))
                mine.append((round, i, samples[j], rollout_to(rows, "cpu") if world.distributed else rows))
        if n_kept >= n:
            break
    # whole mini-batches on every process when there are enough groups (then 1 and N processes take
    # the same mini-batches, passes.mini_batch_rows), else whole groups per process
    unit = world.size * cfg.mini_batches if n_kept >= world.size * cfg.mini_batches else world.size
    n_used = n_kept - n_kept % unit
    rounds = round + 1
    metrics.update(dynamic_sampling_rounds=rounds, dynamic_sampling_dropped_share=1.0 - n_used / (rounds * n),
                   dynamic_sampling_empty=int(n_used == 0), trained_groups=n_used or n)
    if n_used == 0:
        return samples, ro, rewards, metrics
    kept = sorted((x for part in dist_io.gather_objects(mine, world) for x in part), key=lambda x: x[:2])[:n_used]
    share = kept[world.rank * n_used // world.size:(world.rank + 1) * n_used // world.size]
    merged = concat_rollouts([x[3] for x in share], trainer.tok.pad_token_id)
    merged = dataclasses.replace(rollout_to(merged, ro.completion_ids.device), seconds=seconds)
    return [x[2] for x in share], merged, torch.cat(kept_rewards)[:n_used], metrics
