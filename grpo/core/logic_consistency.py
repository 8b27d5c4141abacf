"""The logic-consistency regulariser's mathematics: cosine similarities of (connective, following
step) pairs -> a penalty per completion -> a score-function advantage per completion.

Dimension letters: B prompts, G group size, N = B*G completions, K (connective, step) pairs.

The practice this follows ("GRPO: not an upgrade of PPO but a scalpel for LLM reasoning", Towards
AI, 2025, section 4.2) adds to the GRPO loss

    L_reg = lambda_cons * sum_i [1 - cos(embed(connective_i), embed(step after connective_i))]

with a sentence-embedding model and lambda_cons = 0.05. The embeddings are of *sampled text*: L_reg
has no gradient with respect to the policy's parameters through the embedding model. What the policy
can change is how likely it is to write such text, so the term is minimised as an expectation,
lambda * E_{o ~ pi_theta}[c(o)] with c(o) = sum_i (1 - cos_i), whose gradient is the score function

    lambda * E[(c(o) - b) * grad log pi_theta(o)]

for any baseline b that does not depend on o. With b_i the mean penalty of the *other* G - 1
completions of the same prompt (leave-one-out, as RLOO), each completion gets the advantage

    A_cons_i = -lambda * (c_i - b_i),

which is added to every token's GRPO advantage (``consistency_advantages``). The policy loss then
treats it as it treats the reward's advantage (the same ratio, clip and aggregation), so on-policy
with GRPO's aggregation its gradient is lambda / N * sum_i (c_i - b_i) * (1/|o_i|) sum_t grad log
pi(o_it): the score-function gradient with GRPO's per-completion length normalisation. It is *not*
divided by the group's reward std, so lambda keeps its scale against the unit-std GRPO advantage.
"""

from __future__ import annotations

import torch
from torch import Tensor


def consistency_penalties(cos: Tensor, completion: Tensor, n: int) -> Tensor:
    """c_i = sum over completion i's pairs of (1 - cos). cos: [K] similarities; completion: [K] the
    index in 0..n-1 of each pair's completion. Returns [N] (0 for a completion without connectives)."""
    return torch.zeros(n, dtype=cos.dtype, device=cos.device).index_add_(0, completion, 1.0 - cos)  # [N]


def consistency_advantages(penalties: Tensor, *, coef: float) -> Tensor:
    """A_cons = -coef * (c - leave-one-out group mean of c). penalties: [B, G] with G >= 2 -> [B, G].
    Sums to 0 within each group, and is 0 where every completion of the group has the same penalty."""
    g = penalties.shape[1]
    if g < 2:
        raise ValueError(f"consistency_advantages: a leave-one-out baseline needs a group of 2 or more, got G={g}")
    others = (penalties.sum(dim=1, keepdim=True) - penalties) / (g - 1)  # [B, G]
    return -coef * (penalties - others)  # [B, G]
