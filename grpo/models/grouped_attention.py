"""Shared-prefix attention that computes only what the block mask allows (Prefix Grouper, 2025).

Dimension letters: R packed rows, L columns, Hq / Hk query / key-value heads, D head dim, P a row's
prompt length, G its completions, T the longest of them.

A packed block [prompt, c_1, ..., c_G] (policy.pack_sequences; a row holds one or more) under the
block mask of policy.packed_attention_mask costs one L x L attention per head, of which the prompt's
causal triangle and each completion's P + T_j band are needed: with G = 8 completions of ~40 tokens
after a 60-token prompt, ~20% of it. Here each block's attention is two SDPA calls instead:
  - the prompt on itself, causal;
  - every completion's queries on [the prompt's keys, its own keys] (causal in its own part), the G
    completions batched with the prompt's keys and values expanded, not copied per completion
    before the concatenation;
so the work is P^2 / 2 + G T (P + T) instead of L^2. The prompt's keys and values are the one
prompt pass: the gradients of all G completions flow into them. Same values as SDPA under the
block mask, to fp32 rounding (tests/test_policy.py compares both against one sequence at a time).

Registered as the attention implementation ``grpo_grouped_sdpa`` with transformers' attention
interface; policy.completion_logprobs switches a model to it for one forward and passes the row
layout (``group_layout``) as the keyword argument ``grpo_groups``, which transformers hands to
the attention function. Without that argument it is plain SDPA.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor

NAME = "grpo_grouped_sdpa"


@functools.cache  # once per process: transformers' registries keep what was registered
def register() -> str:
    """Register the implementation (and SDPA's mask for it) with transformers once; returns its name."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        groups = kwargs.pop("grpo_groups", None)
        if groups is None:
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, **kwargs)
        return grouped_attention(query, key, value, groups, scaling=scaling), None

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


@contextmanager
def switched_to(config):
    """Within the block, models with this transformers ``config`` attend through this implementation
    (registered on first use); the config's own implementation is back on exit, also on error."""
    saved = config._attn_implementation
    config._attn_implementation = register()
    try:
        yield
    finally:
        config._attn_implementation = saved


def group_layout(segments: Tensor, blocks: Tensor | None = None) -> list[dict]:
    """Per block of a packed row (segments and blocks [R, L] as policy.pack_sequences makes them:
    segments 0 prompt, j the block's j-th completion, -1 padding; blocks the block's number in its
    row, -1 padding; blocks None = one block per row): its ``row``, first column ``start`` and prompt
    length ``prompt``; the row columns of each completion's tokens ``index`` [G, T] (padded with the
    completion's first column), which of them are real ``valid`` [G, T], and the completions'
    attention mask ``mask`` [G, 1, T, P + T] (True = attend): every prompt key, and its own keys up to
    the query. Padded queries see the prompt only, so no mask row is empty. Also ``columns`` [M] and
    ``slots`` [M]: the M real tokens' columns in the row and their places in the flattened [G * T]
    (``index[valid]`` and ``valid``'s flat positions, computed here once rather than in every layer)."""
    if blocks is None:
        blocks = torch.where(segments >= 0, 0, -1)
    layout = []
    for r, (seg_row, blk_row) in enumerate(zip(segments.cpu(), blocks.cpu())):
        for b in range(int(blk_row.max()) + 1):
            cols_b = torch.nonzero(blk_row == b)[:, 0]  # the block's columns, consecutive
            start, seg = int(cols_b[0]), seg_row[cols_b]
            p = int((seg == 0).sum())
            g = int(seg.max())
            cols = [start + torch.nonzero(seg == j)[:, 0] for j in range(1, g + 1)]
            t = max(len(c) for c in cols)
            index = torch.stack([torch.cat([c, c[:1].expand(t - len(c))]) for c in cols])  # [G, T]
            valid = torch.arange(t)[None, :] < torch.tensor([len(c) for c in cols])[:, None]  # [G, T]
            own = torch.ones(t, t, dtype=torch.bool).tril()[None] & valid[:, None, :]  # [G, T, T] causal, real keys
            mask = torch.cat([torch.ones(g, t, p, dtype=torch.bool), own], 2)[:, None]  # [G, 1, T, P + T]
            layout.append({"row": r, "start": start, "prompt": p, "index": index.to(segments.device),
                           "valid": valid.to(segments.device), "mask": mask.to(segments.device),
                           "columns": index[valid].to(segments.device),
                           "slots": valid.flatten().nonzero()[:, 0].to(segments.device)})
    return layout


def grouped_attention(query: Tensor, key: Tensor, value: Tensor, groups: list[dict], *,
                      scaling: float | None) -> Tensor:
    """Attention of packed shared-prefix rows. query [R, Hq, L, D], key and value [R, Hk, L, D],
    ``groups`` from group_layout. Returns [R, L, Hq, D] (transformers' attention output layout);
    padding columns are 0."""
    out = None
    for grp in groups:
        r, s, index = grp["row"], grp["start"], grp["index"]
        e = s + grp["prompt"]  # the block's prompt is columns s..e-1
        q, k, v = query[r], key[r], value[r]  # [Hq, L, D], [Hk, L, D]
        op = F.scaled_dot_product_attention(q[None, :, s:e], k[None, :, s:e], v[None, :, s:e], is_causal=True,
                                            scale=scaling, enable_gqa=True)[0]  # [Hq, P, D]
        if out is None:  # SDPA's output dtype (bf16 under autocast, whatever q's)
            out = op.new_zeros(query.shape)  # [R, Hq, L, D]
        out[r, :, s:e] = op
        g = index.shape[0]
        qc = q[:, index].transpose(0, 1)  # [G, Hq, T, D]
        kc = torch.cat([k[None, :, s:e].expand(g, -1, -1, -1), k[:, index].transpose(0, 1)], 2)  # [G, Hk, P + T, D]
        vc = torch.cat([v[None, :, s:e].expand(g, -1, -1, -1), v[:, index].transpose(0, 1)], 2)  # [G, Hk, P + T, D]
        oc = F.scaled_dot_product_attention(qc, kc, vc, attn_mask=grp["mask"], scale=scaling,
                                            enable_gqa=True)  # [G, Hq, T, D]
        oc = oc.transpose(0, 1).flatten(1, 2)  # [Hq, G * T, D]
        out[r, :, grp["columns"]] = oc[:, grp["slots"]]  # the real completion tokens' rows
    return out.transpose(1, 2).contiguous()  # [R, L, Hq, D]
