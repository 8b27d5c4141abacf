"""An asynchronous step's figures: each process's part of the step (gathered), the scoring metrics of
the groups trained, and the queue's (staleness histogram, drops, waits).

Dimension letters: B prompts (groups) per step over every process, G group size, N = B*G sequences,
K reward functions.
"""

from __future__ import annotations

import torch

from grpo.core import staleness as st
from grpo.train.source_rewards import source_metrics


def process_part(kept: list, *, dropped: int, staleness: list[int], waited: float, queued: int,
                 labels_of: str | None, group_size: int) -> dict:
    """This process's part of the step, to gather: its groups' rewards, verdicts and scores, and its
    queue figures (``queued``: groups waiting in its queue)."""
    return {"rewards": torch.stack([x.rewards for x in kept]), "per_reward": torch.stack([x.per_reward for x in kept]),
            "correct": torch.cat([x.correct for x in kept]), "scores": torch.cat([x.scores for x in kept]),
            "per_scores": torch.cat([x.per_scores for x in kept]), "dropped": dropped, "staleness": staleness,
            "waited": waited, "queued": queued, "oldest": min(x.draw for x in kept),
            "labels": [x.sample.get(labels_of) for x in kept for _ in range(group_size)] if labels_of else []}


def trained_metrics(last: dict, everyone: list[dict], *, reward_names: list[str], sources) -> dict:
    """The scoring metrics of the groups trained (every process's part): the last draw's, with the
    rewards, the accuracy and a mixture's per-source figures over the groups trained."""
    metrics = {k: v for k, v in last.items() if not k.startswith(("share/", "reward/", "accuracy/"))}
    per_scores = torch.cat([p["per_scores"] for p in everyone])  # [N, K] float64, the synchronous step's metrics'
    metrics.update({f"rewards/{n}": float(torch.nanmean(per_scores[:, i])) for i, n in enumerate(reward_names)})
    correct = torch.cat([p["correct"] for p in everyone])  # [N]
    metrics["accuracy"] = float(correct.double().mean())
    if sources is not None and sources.labels:  # a mixture's per-source metrics, over the groups trained
        labels = [x for p in everyone for x in p["labels"]]
        metrics.update(source_metrics(labels, torch.cat([p["scores"] for p in everyone]), correct, sources.labels))
    return metrics


def queue_metrics(everyone: list[dict], *, max_staleness: int, trained: int, dropped_total: int) -> dict:
    """The staleness histogram of every group taken (``trained`` of them trained, the rest dropped as
    over ``max_staleness``), the drops and the queue's figures."""
    stale_of = [x for p in everyone for x in p["staleness"]]
    hist = st.staleness_histogram(torch.tensor(stale_of), max_staleness=max_staleness).tolist()
    n_dropped = sum(p["dropped"] for p in everyone)
    kept_stale = sorted(stale_of)[:trained]  # the dropped ones are the stalest
    out = {f"async/staleness_{i}": c for i, c in enumerate(hist[:-1])}
    out.update({"async/staleness_over": hist[-1], "async/staleness_mean": sum(kept_stale) / trained,
                "async/staleness_max": max(kept_stale), "async/dropped_groups": n_dropped,
                "async/dropped_share": n_dropped / (n_dropped + trained), "async/dropped_total": dropped_total,
                "async/wait_seconds": max(p["waited"] for p in everyone),
                "async/queued_groups": sum(p["queued"] for p in everyone),
                "async/oldest_draw": min(p["oldest"] for p in everyone)})
    return out
