"""The logic-consistency regulariser on a step's sampled completions (the mathematics and why it is
a score-function advantage: grpo/core/logic_consistency.py; the detector: grpo/data/logic.py).

Each connective of a completion ("therefore", "hence", "因此", "由…得", ...) and the step after it
are embedded; the pair's penalty is 1 - cos. A connective with nothing after it has no step to
embed and counts 1 (cos 0). Note the penalty is a *sum* over connectives, as in the published
formula: a completion with fewer connectives pays less, which the logged connective count shows.

Dimension letters: n completions on this process (whole groups of G), K (connective, step) pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo.core.logic_consistency import consistency_advantages, consistency_penalties
from grpo.data.logic import find_connectives
from grpo.errors import ConfigError


@dataclass(frozen=True)
class LogicConsistencySettings:
    """coef: lambda_cons; model: the sentence-embedding model (grpo.models.embedding); group_size: G."""

    coef: float = 0.05
    model: str = "all-MiniLM-L6-v2"
    group_size: int = 8


class LogicConsistency:
    """Per-completion advantages of the regulariser; ``embedder`` has ``encode(texts) -> [M, D]``
    unit vectors (default: grpo.models.embedding.SentenceEmbedder of ``settings.model``)."""

    def __init__(self, settings: LogicConsistencySettings, embedder=None):
        if settings.coef < 0:
            raise ConfigError(f"logic_consistency_coef: must be >= 0, got {settings.coef}")
        if settings.group_size < 2:
            raise ConfigError("logic_consistency: needs num_generations >= 2 (a leave-one-out baseline)")
        if embedder is None:
            from grpo.models.embedding import SentenceEmbedder

            embedder = SentenceEmbedder(settings.model)
        self.settings, self.embedder = settings, embedder

    def penalties(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """c [n] of each completion and the number of connectives [n] in each."""
        pairs = [(i, c) for i, t in enumerate(texts) for c in find_connectives(t)]
        with_step = [(i, c) for i, c in pairs if c.following]
        cos = torch.zeros(len(pairs))  # [K]; a connective with no step after it: cos 0
        if with_step:
            emb = self.embedder.encode([c.word.lower() for _, c in with_step] + [c.following for _, c in with_step])
            k = len(with_step)
            sims = (emb[:k] * emb[k:]).sum(-1)  # [K'] unit vectors: the cosine
            at = torch.tensor([j for j, (_, c) in enumerate(pairs) if c.following], dtype=torch.long)
            cos[at] = sims.float()
        owner = torch.tensor([i for i, _ in pairs], dtype=torch.long)  # [K]
        counts = torch.bincount(owner, minlength=len(texts)).float() if pairs else torch.zeros(len(texts))
        return consistency_penalties(cos, owner, len(texts)), counts  # [n], [n]

    def advantages(self, texts: list[str]) -> tuple[torch.Tensor, dict]:
        """The advantage A_cons [n] of each completion (whole groups, laid out group by group) and the
        step's metrics: the mean penalty (the published sum of 1 - cos per completion), lambda times
        it, the mean number of connectives, and the mean |A_cons|."""
        g = self.settings.group_size
        pen, counts = self.penalties(texts)  # [n], [n]
        adv = consistency_advantages(pen.view(-1, g), coef=self.settings.coef).reshape(-1)  # [n]
        metrics = {"logic_consistency_penalty": float(pen.mean()),
                   "logic_consistency_loss": self.settings.coef * float(pen.mean()),
                   "logic_connectives_mean": float(counts.mean()),
                   "logic_consistency_advantage_abs": float(adv.abs().mean())}
        has = counts > 0  # [n]
        if has.any():  # the mean cosine of a completion's pairs, over completions with a connective
            metrics["logic_consistency_cos_mean"] = float((1 - pen[has] / counts[has]).mean())
        return adv, metrics


def make_consistency(settings: LogicConsistencySettings | None) -> LogicConsistency | None:
    """The regulariser of ``settings`` (its embedding model loaded), or None when it is off (None)."""
    return None if settings is None else LogicConsistency(settings)
