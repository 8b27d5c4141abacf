"""A step's supervised rows as model input: padded one row per example, or packed several examples to a
row, and the summed negative log-likelihood of their trained tokens.

Packing lays the examples of a step end to end in rows of at most ``max_length`` tokens (first fit,
longest first). Attention stays inside each example through the position ids: they restart at 0 at
every example, and transformers' causal mask (masking_utils.find_packed_sequence_indices) cuts a row
into sequences where the positions restart, giving a block-diagonal causal mask, as long as no 2-D
attention mask and no KV cache is passed. ``packing_isolated`` checks this on the loaded model before
the run trusts it. Every example then sees exactly the tokens it sees alone, so the summed loss and
its gradient equal the unpacked batch's, with no padding computed inside a row.

Dimension letters: b rows of a micro-batch, L their length, K trained tokens, V vocabulary.
"""

from __future__ import annotations

import torch

from grpo.sft.data import SFTExample


def pad_batch(rows: list[SFTExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ids [b, L], attention mask [b, L] and the mask of trained tokens [b, L]."""
    length = max(len(r.ids) for r in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)  # [b, L]
    attn = torch.zeros(len(rows), length, dtype=torch.long)  # [b, L]
    trained = torch.zeros(len(rows), length, dtype=torch.bool)  # [b, L]
    for i, r in enumerate(rows):
        ids[i, :len(r.ids)] = torch.tensor(r.ids)
        attn[i, :len(r.ids)] = 1
        trained[i, :len(r.ids)] = torch.tensor(r.trained)
    return {"ids": ids, "attn": attn, "trained": trained}


def pack_groups(lengths: list[int], max_length: int) -> list[list[int]]:
    """Indices of the examples in each packed row: first fit, longest first, each row's total at most
    ``max_length`` (an example is never longer: rows are cut to it when encoded)."""
    groups: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        row = next((k for k, free in enumerate(room) if free >= lengths[i]), None)
        if row is None:
            groups.append([])
            room.append(max_length)
            row = len(groups) - 1
        groups[row].append(i)
        room[row] -= lengths[i]
    return groups


def packed_batch(rows: list[list[SFTExample]], pad_id: int) -> dict[str, torch.Tensor]:
    """Packed rows (each a list of examples laid end to end), right-padded: ids [b, L], position ids
    [b, L] restarting at 0 at each example (and in the padding, its own sequence, after all real
    tokens) and the trained tokens [b, L]. No attention mask: the positions delimit the examples."""
    length = max(sum(len(e.ids) for e in row) for row in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)  # [b, L]
    pos = torch.zeros(len(rows), length, dtype=torch.long)  # [b, L]
    trained = torch.zeros(len(rows), length, dtype=torch.bool)  # [b, L]
    for i, row in enumerate(rows):
        at = 0
        for e in row + [SFTExample([pad_id] * (length - sum(len(x.ids) for x in row)), [])]:
            n = len(e.ids)
            ids[i, at:at + n] = torch.tensor(e.ids, dtype=torch.long)
            pos[i, at:at + n] = torch.arange(n)
            # the first token of an example is predicted by nothing in it: its prediction from the
            # example before in the row is never trained
            trained[i, at + 1:at + len(e.trained)] = torch.tensor(e.trained[1:], dtype=torch.bool)
            at += n
    return {"ids": ids, "pos": pos, "trained": trained}


def micro_batches(rows: list[SFTExample], *, micro: int, pad_id: int, packing: bool,
                  max_length: int) -> list[dict[str, torch.Tensor]]:
    """The forwards of a process's share of a step: ``micro`` padded rows each, or, with packing,
    ``micro`` packed rows each."""
    if not packing:
        return [pad_batch(rows[i:i + micro], pad_id) for i in range(0, len(rows), micro)]
    packed = [[rows[i] for i in g] for g in pack_groups([len(r.ids) for r in rows], max_length)]
    return [packed_batch(packed[i:i + micro], pad_id) for i in range(0, len(packed), micro)]


def summed_nll(model, batch: dict[str, torch.Tensor], *, autocast: bool) -> torch.Tensor:
    """Sum over the trained tokens (position 0 of each example excluded: nothing predicts it) of
    -log p(token | the tokens of its example before it). A packed batch passes its position ids and
    no attention mask; no cache, which would switch transformers' packed-sequence mask off."""
    device = next(model.parameters()).device
    batch = {k: v.to(device) for k, v in batch.items()}
    inputs = ({"position_ids": batch["pos"]} if "pos" in batch else {"attention_mask": batch["attn"]})
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=batch["ids"], use_cache=False, **inputs).logits[:, :-1]  # [b, L-1, V]
    sel = batch["trained"][:, 1:]  # [b, L-1] the token at t + 1 is predicted at t
    picked = logits[sel].float()  # [K, V]
    return torch.nn.functional.cross_entropy(picked, batch["ids"][:, 1:][sel], reduction="sum")  # []


@torch.no_grad()
def packing_isolated(model, vocab_size: int) -> bool:
    """Whether this model keeps packed examples apart: the logits of an example packed after another
    match those of the example alone far more closely than those of the same row with a plain causal
    mask (the leak packing must prevent). Eval mode, so dropout does not blur the comparison."""
    was_training = model.training
    model.eval()
    g = torch.Generator().manual_seed(0)
    first, second = (torch.randint(0, vocab_size, (1, n), generator=g) for n in (6, 5))  # [1, 6], [1, 5]
    row = torch.cat([first, second], 1)  # [1, 11]
    pos = torch.cat([torch.arange(6), torch.arange(5)])[None]  # [1, 11]
    device = next(model.parameters()).device
    row, pos, second = row.to(device), pos.to(device), second.to(device)
    alone = model(input_ids=second, use_cache=False).logits[0].float()  # [5, V]
    packed = model(input_ids=row, position_ids=pos, use_cache=False).logits[0, 6:].float()  # [5, V]
    leaky = model(input_ids=row, position_ids=pos, attention_mask=torch.ones_like(row),
                  use_cache=False).logits[0, 6:].float()  # [5, V]
    model.train(was_training)
    return float((packed - alone).abs().max()) < 0.1 * float((leaky - alone).abs().max())
