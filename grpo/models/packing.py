"""How a batch of prompt + completion sequences becomes model input: padding trimmed, sequences
packed into rows without padding work (optionally one prompt pass per group), position ids and the
block attention mask of a packed row.

Dimension letters: N sequences, P prompt tokens, T completion tokens, R packed rows, L row length.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_masks(completion_mask: Tensor, loss_mask: Tensor | None = None) -> Tensor:
    """Raise ValueError unless ``completion_mask`` [N, T] (tokens in the context) is 1 up to each
    completion's end and 0 after it, and ``loss_mask`` [N, T] (tokens trained on; holes allowed) is
    0 wherever it is 0. Returns the completion lengths [N]. Why a prefix: positions, packing and the
    critic's value columns read a completion as its first c_len tokens; a token in the context but
    out of the loss (a tool's output) belongs in loss_mask, not as a hole in completion_mask."""
    c_len = completion_mask.long().sum(1)  # [N]
    cols = torch.arange(completion_mask.shape[1], device=completion_mask.device)  # [T]
    if not torch.equal(completion_mask.bool(), cols < c_len[:, None]):
        raise ValueError("completion_mask: must be 1 up to the completion's end and 0 after it "
                         "(tokens in the context but out of the loss belong in loss_mask)")
    if loss_mask is not None and bool((loss_mask.bool() & ~completion_mask.bool()).any()):
        raise ValueError("loss_mask: 1 on a token outside completion_mask (trained tokens must be in the context)")
    return c_len


def base_model(model):
    """The model under a PEFT wrapper (its LoRA layers still in it), else the model itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def trim_padding(prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                 completion_mask: Tensor) -> dict[str, Tensor]:
    """Drop prompt columns that are padding in every row (left) and completion columns that are
    padding in every row (right), so a micro-batch costs only its longest real sequence."""
    keep_p = prompt_mask.any(0).nonzero()  # [k, 1]
    p0 = int(keep_p[0]) if len(keep_p) else prompt_mask.shape[1]
    keep_t = completion_mask.any(0).nonzero()
    t1 = int(keep_t[-1]) + 1 if len(keep_t) else 1
    return {"prompt_ids": prompt_ids[:, p0:], "prompt_mask": prompt_mask[:, p0:],
            "completion_ids": completion_ids[:, :t1], "completion_mask": completion_mask[:, :t1]}


def model_inputs(prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                 completion_mask: Tensor) -> dict[str, Tensor]:
    """Prompt + completion as one padded-trimmed batch: input ids, attention mask and positions
    [N, P' + T'] that follow the mask (left padding does not shift them, as during generation), plus
    the trimmed completion ids [N, T']."""
    tr = trim_padding(prompt_ids, prompt_mask, completion_ids, completion_mask)
    ids = torch.cat([tr["prompt_ids"], tr["completion_ids"]], 1)  # [N, P' + T']
    attn = torch.cat([tr["prompt_mask"], tr["completion_mask"]], 1)  # [N, P' + T']
    pos = (attn.cumsum(1) - 1).clamp(min=0)  # [N, P' + T']
    return {"input_ids": ids, "attention_mask": attn, "position_ids": pos, "completion_ids": tr["completion_ids"]}


def pack_sequences(prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, completion_mask: Tensor, *,
                   share_prompt: bool, max_row_tokens: int = 0, loss_mask: Tensor | None = None) -> dict:
    """Lay N (prompt, completion) pairs out as R packed rows of real tokens only, right-padded to L.

    With ``share_prompt``, consecutive sequences with the same prompt (the G completions of a group)
    share one block [prompt, c_1, c_2, ...] of a row, each completion attending to the one prompt pass
    and to itself (shared-prefix training, Prefix Grouper 2025), so the prompt is computed once and
    every completion's gradient flows into it. The next group's block follows in the same row while
    the row stays within ``max_row_tokens`` (0 = no limit), so a forward pass holds one row of real
    tokens rather than one row per group padded to the longest (4 groups of 32 completions: 1,380
    padded columns for 997 tokens); a block that would pass the limit starts a new row, with its
    prompt again if the group continues, which bounds a row's length. Without sharing each sequence
    is its own row [prompt, c]. ``completion_mask`` (the context) must be a 0/1 prefix mask (tokens
    up to and including EOS); every prompt must have a token. ``loss_mask`` (tokens trained on, within
    completion_mask, holes allowed; None: all of the context) changes nothing in the layout: every
    context token is packed and scored, and ``loss`` marks those that count.

    Returns input_ids, position_ids, segments and blocks [R, L] (segments: 0 prompt, j for the
    block's j-th completion, -1 padding; blocks: the block's number in its row, -1 padding);
    logits_to_keep (the columns whose logits are needed: an int L - first when they are the last
    columns, else a 1-D tensor of them, ascending); index [N, T'] (the row of those logits, flattened
    to [R * K, V], that scores each completion token), tokens [N, T'], valid [N, T'] (bool: in the
    context) and loss [N, T'] (bool: valid and in loss_mask), T' the longest completion.
    """
    n, dev = prompt_ids.shape[0], completion_ids.device
    c_len = check_masks(completion_mask, loss_mask)  # [N]
    if bool((prompt_mask.sum(1) == 0).any()):
        raise ValueError("prompt_mask: every sequence needs at least one prompt token")
    c_len = c_len.tolist()
    rows: list[dict] = []
    seq_row, seq_start, seq_prompt_end = [], [], []  # each sequence's row, first completion column, prompt end
    for i in range(n):
        prompt = prompt_ids[i][prompt_mask[i].bool()]  # [P_i]
        p, c = len(prompt), completion_ids[i, :c_len[i]]  # [L_i]
        row = rows[-1] if rows else None
        room = max_row_tokens - row["len"] if row is not None and max_row_tokens else None
        if not (share_prompt and row is not None and torch.equal(row["prompt"], prompt)
                and (room is None or len(c) <= room)):
            if not (share_prompt and row is not None and (room is None or p + len(c) <= room)):
                row = {"ids": [], "pos": [], "seg": [], "blk": [], "len": 0, "block": -1}
                rows.append(row)
            row.update(prompt=prompt, block=row["block"] + 1, prompt_end=row["len"] + p, members=0)
            _append(row, prompt, torch.arange(p), 0)
        row["members"] += 1
        seq_row.append(len(rows) - 1)
        seq_start.append(row["len"])
        seq_prompt_end.append(row["prompt_end"])
        _append(row, c, torch.arange(p, p + len(c)), row["members"])
    ids, pos, seg, blk = _row_tensors(rows, completion_ids)  # each [R, L]
    width = ids.shape[1]
    sc = _scoring_columns(seq_row, seq_start, seq_prompt_end, c_len, width)
    keep, valid = sc["logits_to_keep"], sc["valid"].to(dev)  # valid [N, T']
    tokens = torch.where(valid, completion_ids[:, :valid.shape[1]], 0)  # [N, T']
    loss = valid if loss_mask is None else valid & _fit(loss_mask, valid.shape[1]).bool()  # [N, T']
    return {"input_ids": ids, "position_ids": pos.to(dev), "segments": seg.to(dev), "blocks": blk.to(dev),
            "logits_to_keep": keep if isinstance(keep, int) else keep.to(dev),
            "index": sc["index"].to(dev), "tokens": tokens, "valid": valid, "loss": loss}


def _row_tensors(rows: list[dict], like: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The packed rows as input ids (``like``'s dtype), positions, segments and blocks, each [R, L],
    right-padded (ids and positions 0, segments and blocks -1)."""
    r, width = len(rows), max(row["len"] for row in rows)
    ids = like.new_zeros(r, width)  # [R, L]
    pos = torch.zeros(r, width, dtype=torch.long)  # [R, L]
    seg = torch.full((r, width), -1, dtype=torch.long)  # [R, L]
    blk = torch.full((r, width), -1, dtype=torch.long)  # [R, L]
    for k, row in enumerate(rows):
        for out, key in ((ids, "ids"), (pos, "pos"), (seg, "seg"), (blk, "blk")):
            out[k, :row["len"]] = torch.cat(row[key])
    return ids, pos, seg, blk


def _fit(mask: Tensor, width: int) -> Tensor:
    """mask [N, T] cut or right-padded with 0 to [N, width] (T' can exceed T when no token is real)."""
    return torch.nn.functional.pad(mask[:, :width], (0, max(0, width - mask.shape[1])))


def _scoring_columns(seq_row: list[int], seq_start: list[int], seq_prompt_end: list[int], c_len: list[int],
                     width: int) -> dict:
    """Which columns of the packed rows [R, L] need logits, and where each completion token's are.
    Column q scores the token at q + 1, so a completion's first token is scored at its prompt's last
    column and the others at their own predecessors. Returns logits_to_keep (an int K when the columns
    are the last K of every row, the model's plain form, else the ascending 1-D tensor of them), index
    [N, T'] (the flattened [R * K] row scoring each token) and valid [N, T']."""
    n, t_max = len(c_len), max(max(c_len), 1)
    row_of = torch.tensor(seq_row)[:, None].expand(n, t_max)  # [N, T']
    col = torch.zeros(n, t_max, dtype=torch.long)  # [N, T']
    for i in range(n):
        if c_len[i]:
            col[i, 0] = seq_prompt_end[i] - 1
            col[i, 1:c_len[i]] = torch.arange(seq_start[i], seq_start[i] + c_len[i] - 1)
    valid = torch.arange(t_max)[None, :] < torch.tensor(c_len)[:, None]  # [N, T']
    keep = torch.unique(col[valid]) if bool(valid.any()) else torch.tensor([width - 1])  # [K] ascending
    if len(keep) == width - int(keep[0]):  # the last K columns: the model's plain int form
        keep = width - int(keep[0])
        index = row_of * keep + (col - (width - keep))
    else:
        index = row_of * len(keep) + torch.searchsorted(keep, col)
    return {"logits_to_keep": keep, "index": torch.where(valid, index, 0), "valid": valid}  # index [N, T']


def _append(row: dict, ids: Tensor, pos: Tensor, segment: int) -> None:
    """Add tokens ``ids`` at positions ``pos`` to a packed row as segment ``segment`` of its current block."""
    row["ids"].append(ids)
    row["pos"].append(pos)
    row["seg"].append(torch.full((len(ids),), segment, dtype=torch.long))
    row["blk"].append(torch.full((len(ids),), row["block"], dtype=torch.long))
    row["len"] += len(ids)


def shares_rows(segments: Tensor, blocks: Tensor) -> bool:
    """Whether some packed row holds more than one sequence (two completions, or two blocks), so
    that attention needs more than a padding mask."""
    return int(segments.max()) > 1 or int(blocks.max()) > 0


def packed_attention_mask(segments: Tensor, blocks: Tensor | None = None, *, attn_implementation: str,
                          dtype: torch.dtype) -> Tensor:
    """The attention mask of packed rows (segments and blocks [R, L], as pack_sequences makes them;
    blocks None: one block per row): a [R, L] padding mask when no row holds more than one
    completion; else [R, 1, L, L], query q seeing key k <= q of its block's prompt or of its own
    completion (boolean for SDPA, additive for eager attention). Padding queries see the first
    block's prompt, so no row of the mask is empty."""
    if blocks is None:
        blocks = torch.where(segments >= 0, 0, -1)  # [R, L]
    if not shares_rows(segments, blocks):
        return (segments >= 0).long()  # [R, L]
    if attn_implementation not in SHARED_PREFIX_ATTENTION:
        raise ValueError(f"shared-prefix training needs attention in {list(SHARED_PREFIX_ATTENTION)}; "
                         f"the model uses {attn_implementation!r}")
    q, k = segments[:, :, None], segments[:, None, :]  # [R, L, 1], [R, 1, L]
    width = segments.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=segments.device).tril()  # [L, L]
    bq, bk = blocks[:, :, None], blocks[:, None, :]  # [R, L, 1], [R, 1, L]
    block = (bq == bk) | ((bq < 0) & (bk == 0))  # [R, L, L] padding queries: the first block
    allowed = (causal & block & ((k == 0) | (k == q)))[:, None]  # [R, 1, L, L]
    if attn_implementation == "sdpa":
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=segments.device).masked_fill_(~allowed, torch.finfo(dtype).min)


# attention implementations that take a custom 4D mask (flash-attention kernels take none)
SHARED_PREFIX_ATTENTION = ("sdpa", "eager")


def sliding_window(config) -> int | None:
    """The model's attention window when it has one in use (Mistral, Qwen2 with use_sliding_window,
    Gemma 2/3 ...), else None."""
    window = getattr(config, "sliding_window", None)
    if not window or getattr(config, "use_sliding_window", True) is False:
        return None
    return int(window)
