"""Token weights on the advantage (seed 003 section 5.1): in code, identifier and operator tokens carry
more of a program's logic than the words around them, so their advantage is multiplied by gamma
(the seed: 2.0). gamma = 1 leaves the advantages as they are.

Dimension letters: N sequences, T completion tokens, V vocabulary.
"""

from __future__ import annotations

import torch


def token_weights(completion_ids: torch.Tensor, weighted_vocab: torch.Tensor, *, gamma: float) -> torch.Tensor:
    """Weights [N, T]: gamma on tokens whose id is marked in ``weighted_vocab`` [V] (bool), else 1.
    ``completion_ids`` [N, T] may hold padding ids (their weight is irrelevant under the loss mask); ids
    past the end of ``weighted_vocab`` are unmarked."""
    v = weighted_vocab.shape[0]
    marked = weighted_vocab[completion_ids.clamp(0, v - 1)] & (completion_ids < v)  # [N, T] bool
    return torch.where(marked, torch.full_like(marked, gamma, dtype=torch.float32),
                       torch.ones_like(marked, dtype=torch.float32))  # [N, T]


def weighted_advantages(advantages: torch.Tensor, completion_ids: torch.Tensor, weighted_vocab: torch.Tensor, *,
                        gamma: float) -> torch.Tensor:
    """Advantages [N, T] with the marked tokens' entries multiplied by gamma."""
    w = token_weights(completion_ids, weighted_vocab, gamma=gamma).to(advantages.dtype)  # [N, T]
    return advantages * w  # [N, T]
