"""Per-token log-probs and entropies of completions under a model (policy or reference), and the
in-place gradient of a tied input embedding.

Dimension letters: N sequences, P prompt tokens, T completion tokens, V vocabulary, H hidden size.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

from grpo.core import indexed_logprobs_and_entropy
from grpo.models import grouped_attention
from grpo.models.packing import shares_rows, base_model, pack_sequences, packed_attention_mask


class _EmbeddingIntoGrad(torch.autograd.Function):
    """An embedding lookup whose weight gradient is added in place into ``weight.grad`` (rows of the
    tokens seen) rather than handed to autograd; see tied_embedding_grad_in_place. The weight is no
    input of the graph (so autograd accumulates the output layer's gradient alone, as soon as it is
    ready, taking its buffer as ``.grad``); ``anchor``, an empty leaf, makes the output require grad."""

    @staticmethod
    def forward(ctx, ids: Tensor, anchor: Tensor, emb: torch.nn.Embedding) -> Tensor:
        ctx.save_for_backward(ids)
        ctx.emb = emb
        return torch.nn.functional.embedding(ids, emb.weight, emb.padding_idx)  # [..., H]

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # [..., H]
        (ids,) = ctx.saved_tensors
        w, padding_idx = ctx.emb.weight, ctx.emb.padding_idx
        ids, g = ids.reshape(-1), grad_out.reshape(-1, grad_out.shape[-1]).to(w.dtype)  # [M], [M, H]
        if padding_idx is not None:  # as F.embedding: the padding row gets no gradient
            g = g * (ids != padding_idx)[:, None]
        if w.grad is None:  # no output-layer gradient yet: it is added to this one when it comes
            w.grad = torch.zeros_like(w)
        w.grad.index_add_(0, ids, g)
        return None, None, None


_ANCHOR = torch.empty(0, requires_grad=True)


@contextlib.contextmanager
def tied_embedding_grad_in_place(model, *, enabled: bool = True):
    """Within the block, forwards of ``model`` add its input embedding's weight gradient straight
    into ``weight.grad`` (index_add_ over the rows of the tokens seen) where that weight is trainable
    and tied to the output layer. The result is the same dense gradient: the output layer's part
    reaches ``.grad`` through autograd (first: the output layer's backward runs before the
    embedding's), and the two add up.

    Why: autograd sums a tied weight's two gradients before accumulating them, and the embedding's
    (dense, or sparse with ``sparse=True``) was summed by building a new [V, H] matrix: 113 MB for
    SmolLM2, filled or copied on each backward pass, 0.1-0.3 s on the 2-core bench machine.
    Only a plain ``torch.nn.Embedding`` without max_norm or scale_grad_by_freq qualifies (subclasses
    such as Gemma's scaled embedding keep their own forward). The trainer uses it on one process
    only: DDP and FSDP2 synchronise gradients that go through autograd, which this one does not."""
    base = base_model(model)
    emb, head = (base.get_input_embeddings(), base.get_output_embeddings()) if enabled else (None, None)
    tied = (type(emb) is torch.nn.Embedding and emb.weight.requires_grad and getattr(head, "weight", None) is emb.weight
            and emb.max_norm is None and not emb.scale_grad_by_freq)
    if tied:
        emb.forward = lambda ids: _EmbeddingIntoGrad.apply(ids, _ANCHOR, emb)
    try:
        yield tied
    finally:
        if tied:
            del emb.forward  # the class's forward again


def completion_logprobs(model, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                        completion_mask: Tensor, *, temperature: float, with_entropy: bool = False,
                        autocast: bool = False, share_prompt: bool = False,
                        attn_implementation: str = "sdpa", max_row_tokens: int = 0,
                        loss_mask: Tensor | None = None, processing: dict | None = None) -> dict:
    """Run the model on prompt + completion and return {"logp": [N, T], "entropy": [N, T]} for the
    completion tokens (zero beyond each completion's mask); the entropy is detached unless
    ``with_entropy`` (then it carries a gradient, for an entropy term in the loss).

    ``completion_mask`` [N, T] is the context (a prefix mask), which the model reads in full;
    ``loss_mask`` [N, T] (within it, holes allowed, e.g. a tool's output) zeroes the log-probs and
    entropies of the context tokens outside it, so they carry neither value nor gradient into a loss
    that forgets its mask. None: every context token counts (the same numbers as loss_mask =
    completion_mask).

    Sequences are packed without padding work (``pack_sequences``); with ``share_prompt`` the G
    completions of a group share one prompt pass (rows of at most ``max_row_tokens``). Positions
    continue from each prompt's real tokens, as during generation. Only the columns that score a
    completion token go through the LM head (``logits_to_keep``), and no full-vocabulary copy of
    the logits is made. ``autocast`` runs the
    transformer body in bf16 (see ``grpo.models.precision.keep_head_fp32`` for the head).

    ``processing`` (top_k, top_p, min_p, repetition_penalty: the run's sampling beside the temperature):
    also "qlogp" [N, T], log q of each token under the sampling distribution (grpo.core.sampling),
    without gradient, for the importance corrections.
    """
    n, t_full = completion_ids.shape
    pk = pack_sequences(prompt_ids, prompt_mask, completion_ids, completion_mask, share_prompt=share_prompt,
                        max_row_tokens=max_row_tokens, loss_mask=loss_mask)
    dtype = next(p for p in model.parameters()).dtype
    kwargs, switched = {}, contextlib.nullcontext()
    if attn_implementation == "sdpa" and shares_rows(pk["segments"], pk["blocks"]):
        # SDPA on only the blocks the mask allows (grouped_attention.py); no L x L mask
        kwargs, attn = {"grpo_groups": grouped_attention.group_layout(pk["segments"], pk["blocks"])}, None
        switched = grouped_attention.switched_to(getattr(model, "module", model).config)  # through DDP
    else:
        attn = packed_attention_mask(pk["segments"], pk["blocks"], attn_implementation=attn_implementation,
                                     dtype=torch.bfloat16 if autocast else dtype)
    with switched, torch.autocast(completion_ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=pk["input_ids"], attention_mask=attn, position_ids=pk["position_ids"],
                       use_cache=False, logits_to_keep=pk["logits_to_keep"], **kwargs).logits  # [R, K, V]
    out = indexed_logprobs_and_entropy(logits.reshape(-1, logits.shape[-1]), pk["index"], pk["tokens"],
                                       temperature=temperature)  # a view: the model's logits are contiguous
    logp = torch.where(pk["loss"], out["logp"], 0.0)  # [N, T']
    ent = torch.where(pk["loss"], out["entropy"], 0.0)  # [N, T']
    if not with_entropy:
        ent = ent.detach()
    out = {"logp": logp, "entropy": ent}
    if processing is not None:
        flat = logits.reshape(-1, logits.shape[-1])  # [K, V]
        out["qlogp"] = torch.where(pk["loss"], _sampling_logprobs(flat, pk, prompt_ids, prompt_mask, completion_ids,
                                                                  temperature=temperature, processing=processing), 0.0)
    pad = t_full - logp.shape[1]
    return {k: torch.nn.functional.pad(v, (0, pad)) if pad else v for k, v in out.items()}  # [N, T] each


Q_FLOOR = -1e4  # log q of a token the trainer's q does not keep: its weight exp(q - q_engine) is 0, and stays finite
Q_CHUNK = 256  # positions per pass: each pass holds a few [chunk, V] tensors (the sort of top-p among them)


@torch.no_grad()
def _sampling_logprobs(flat: Tensor, pk: dict, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, *,
                       temperature: float, processing: dict) -> Tensor:
    """log q [N, T'] of the scored tokens (core.processed_logprobs), row by row in chunks of Q_CHUNK positions;
    the context of position t is the prompt's real tokens and the completion's first t (the penalty's)."""
    from grpo import core

    n, width = pk["tokens"].shape
    vocab = flat.shape[-1]
    out = torch.zeros(n, width, device=flat.device)  # [N, T']
    penalized = processing.get("repetition_penalty", 1.0) != 1.0
    for i in range(n):
        if penalized:  # the position each token first appears at in the completion (width: never)
            first = torch.full((vocab,), width, dtype=torch.long, device=flat.device)  # [V]
            first.scatter_reduce_(0, completion_ids[i, :width], torch.arange(width, device=flat.device), "amin")
            base = core.seen_tokens(prompt_ids[i:i + 1], prompt_mask[i:i + 1], vocab)  # [1, V]
        for lo in range(0, width, Q_CHUNK):
            pos = torch.arange(lo, min(lo + Q_CHUNK, width), device=flat.device)  # [c]
            seen = base | (first[None, :] < pos[:, None]) if penalized else None  # [c, V]
            q = core.processed_logprobs(flat[pk["index"][i, pos]], pk["tokens"][i, pos], temperature=temperature,
                                        seen=seen, **processing)  # [c]
            out[i, pos] = q.clamp(min=Q_FLOOR)
    return out
