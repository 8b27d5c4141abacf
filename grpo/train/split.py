"""How a step's sequences are split for the update: which rows need a backward pass at all, which
rows form each mini-batch (one optimizer step), and how a micro-batch is cut into forward/backward
chunks of bounded size. Pure functions of masks and
settings (the trainer decides when they apply).

Dimension letters: N sequences (rows), P prompt tokens, T completion tokens, G group size.
"""

from __future__ import annotations

import torch
from torch import Tensor


def forward_chunks(prompt_mask: Tensor, completion_mask: Tensor, rows: Tensor, *, budget: int, group_size: int,
                   share_prompt: bool) -> list[Tensor]:
    """``rows`` (indices into prompt_mask [N, P] and completion_mask [N, T]) cut, in order, into
    chunks of at most ``budget`` packed tokens each; with ``share_prompt`` a prompt counts once per
    chunk for the consecutive rows of its group (rows // group_size). A sequence longer than the budget
    gets a chunk of its own; budget 0 keeps one chunk. The gradient summed over the chunks is the
    gradient of one pass (verl's dynamic batch size follows the same idea)."""
    if not budget or len(rows) <= 1:
        return [rows]
    p_len = prompt_mask[rows].sum(1).tolist()
    c_len = completion_mask[rows].sum(1).tolist()
    chunks, cur, cost = [], [], 0
    for k, row in enumerate(rows.tolist()):
        shared = share_prompt and cur and cur[-1] // group_size == row // group_size
        add = c_len[k] + (0 if shared else p_len[k])
        if cur and cost + add > budget:
            chunks.append(cur)
            cur, cost, add = [], 0, c_len[k] + p_len[k]
        cur.append(row)
        cost += add
    chunks.append(cur)
    return [torch.tensor(p, dtype=rows.dtype) for p in chunks]


def rows_with_gradient(advantages: Tensor, mask: Tensor, *, group_size: int) -> Tensor:
    """Indices [n'] of the sequences whose advantage is non-zero on some counted token (advantages,
    mask [N, T]). Where the objective has no other term (beta = 0, mu = 1, no entropy or covariance
    term) the others have a zero gradient: their ratio is 1 and their surrogate 0. When none is
    left, the first group is kept so that the step still has entropy, ratio and clip metrics."""
    live = ((advantages != 0) & (mask > 0)).any(1)  # [N]
    if not live.any():
        live[:group_size] = True
    return live.nonzero().flatten().cpu()


def mini_batch_rows(groups: int, group_size: int, mini_batches: int) -> list[Tensor]:
    """The rows of each mini-batch of a process's ``groups`` groups of ``group_size`` consecutive rows:
    group j goes to mini-batch j mod ``mini_batches``. Striding, rather than cutting blocks, makes the
    step's mini-batches the same on any number of processes that each hold an equal, contiguous share
    of its groups (global group r * b + j has j's residue when mini_batches divides b), so one process
    and several take the same optimizer steps. With fewer groups than mini-batches (a dynamic-sampling
    step that ran out of rounds) some are empty, on every process alike."""
    g = torch.arange(groups)  # [groups]
    return [(g[g % mini_batches == k][:, None] * group_size + torch.arange(group_size)).flatten()
            for k in range(mini_batches)]  # each [groups / mini_batches * group_size]
