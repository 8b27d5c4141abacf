"""The sampling distribution q: the policy's scores with the repetition penalty, the temperature and the
truncations (top-k, top-p, min-p), renormalized over the tokens kept, in transformers' ``generate``
order (its processors: the penalty; then its warpers: temperature, top-k, top-p, min-p).

Which distribution each number uses:
- the loss (the policy ratio, the KL, the entropy) uses pi_T = softmax(logits / T) over the whole
  vocabulary, as TRL and verl do;
- the engines draw from q and report log q of each drawn token (``Rollout.sampling_logp``; vLLM's
  ``processed_logprobs`` are the same quantity);
- the importance corrections (``rollout_correction``, the staleness correction of asynchronous rollouts)
  compare the engine's log q with the trainer's log q of the same token, computed here from the
  trainer's logits. Comparing log q with log pi_T instead would put the kept mass, a per-token bias
  below 1, into every weight (TRL fixed this in 1.17).

Dimension letters: M rows, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor

NEG_INF = float("-inf")


def truncates(*, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0) -> bool:
    """Whether q differs from pi_T (a truncation or a penalty is set); no tensor (shape: none)."""
    return top_k > 0 or top_p < 1.0 or min_p > 0.0 or repetition_penalty != 1.0


def seen_tokens(context: Tensor, mask: Tensor, vocab: int) -> Tensor:
    """[M, V] bool: the tokens each row's context holds (``context`` [M, L] ids, ``mask`` [M, L] 1 on real ones)."""
    seen = torch.zeros(context.shape[0], vocab, dtype=torch.bool, device=context.device)  # [M, V]
    return seen.scatter_(1, context.clamp(0, vocab - 1), mask.bool()) if context.numel() else seen


def processed_scores(scores: Tensor, *, temperature: float, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                     repetition_penalty: float = 1.0, seen: Tensor | None = None) -> Tensor:
    """q's scores [M, V] (float32, -inf outside the tokens kept) from the policy's scores [M, V];
    ``seen`` [M, V] bool: the tokens the context holds (needed with a repetition penalty)."""
    s = scores.float()
    if repetition_penalty != 1.0:  # CTRL (Keskar et al. 2019), as transformers applies it
        if seen is None:
            raise ValueError("repetition_penalty: the context's tokens (seen) are needed")
        s = torch.where(seen, torch.where(s < 0, s * repetition_penalty, s / repetition_penalty), s)  # [M, V]
    if temperature != 1.0:
        s = s / temperature
    if 0 < top_k < s.shape[-1]:
        kth = torch.topk(s, top_k, dim=-1).values[:, -1:]  # [M, 1]
        s = s.masked_fill(s < kth, NEG_INF)
    if top_p < 1.0:  # the smallest set of most likely tokens whose mass reaches top_p (Holtzman et al. 2020)
        ordered, order = torch.sort(s, descending=False)  # [M, V]
        drop = ordered.softmax(-1).cumsum(-1) <= 1 - top_p  # [M, V]
        drop[:, -1] = False  # the most likely token stays
        s = s.masked_fill(drop.scatter(1, order, drop), NEG_INF)
    if min_p > 0.0:  # tokens below min_p times the most likely token's probability (Nguyen et al. 2024)
        probs = s.softmax(-1)  # [M, V]
        drop = probs < min_p * probs.amax(-1, keepdim=True)
        drop.scatter_(1, probs.argmax(-1, keepdim=True), False)
        s = s.masked_fill(drop, NEG_INF)
    return s


def processed_logprobs(scores: Tensor, tokens: Tensor, **settings) -> Tensor:
    """log q of ``tokens`` [M] under ``processed_scores(scores, **settings)``: [M, V], [M] -> [M]
    (-inf for a token q does not keep)."""
    s = processed_scores(scores, **settings)  # [M, V]
    return s.log_softmax(-1).gather(1, tokens[:, None])[:, 0]  # [M]
