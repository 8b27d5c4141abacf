"""How the trainer runs a model over a rollout's sequences: the layout (one prompt pass per group,
packed rows, forward chunks of bounded size) and the precision are fixed once per run; the
temperature, which a controller may move, is given per call.

Dimension letters: N sequences (rows), T completion tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from grpo.train import split
from grpo.models.logprobs import completion_logprobs, tied_embedding_grad_in_place
from grpo.rollout import Rollout


@dataclass(frozen=True)
class Forwards:
    group_size: int
    share_prompt: bool  # the G completions of a group attend to one prompt pass (Prefix Grouper)
    attn_implementation: str
    autocast: bool  # bf16 autocast of the transformer body
    max_tokens: int  # tokens per forward pass and per packed row; 0: no limit
    sharded: bool  # FSDP2: one pass per micro-batch (every process runs the same count), no inference tensors
    tied_grad_in_place: bool  # policy.tied_embedding_grad_in_place; one process only
    # the run's sampling beside the temperature (top_k, top_p, min_p, repetition_penalty) where the importance
    # corrections compare log q (grpo.core.sampling); None: q is pi_T, or nothing corrects
    processing: dict | None = None

    def chunks(self, ro: Rollout, rows: Tensor) -> list[Tensor]:
        """One micro-batch's rows [n] in forward chunks of at most ``max_tokens`` tokens: the tokens that go
        through the model, so context tokens (completion_mask), trained or not."""
        return split.forward_chunks(ro.prompt_mask, ro.completion_mask, rows,
                                     budget=0 if self.sharded else self.max_tokens,
                                     group_size=self.group_size, share_prompt=self.share_prompt)

    def logprobs(self, model, ro: Rollout, idx: Tensor, *, temperature: float, with_entropy: bool = False,
                 with_q: bool = False) -> dict:
        """{"logp": [n, T], "entropy": [n, T]} (completion_logprobs) of rows ``idx`` under ``model`` (the policy,
        possibly wrapped by DDP or FSDP2, or the reference): the model reads the context
        (completion_mask); tokens outside the rollout's loss_mask get 0. ``with_q`` (and ``processing``
        set): also "qlogp" [n, T], log q of the tokens (grpo.core.sampling), without gradient."""
        with tied_embedding_grad_in_place(model, enabled=self.tied_grad_in_place and torch.is_grad_enabled()):
            return completion_logprobs(model, ro.prompt_ids[idx], ro.prompt_mask[idx], ro.completion_ids[idx],
                                       ro.completion_mask[idx], temperature=temperature, with_entropy=with_entropy,
                                       autocast=self.autocast, share_prompt=self.share_prompt,
                                       attn_implementation=self.attn_implementation, max_row_tokens=self.max_tokens,
                                       loss_mask=ro.loss_mask[idx], processing=self.processing if with_q else None)

    def frozen_logps(self, model, ro: Rollout, *, temperature: float, micro_batch: int) -> Tensor:
        """Log-probs [N, T] of the whole rollout under ``model`` (``frozen``)."""
        return self.frozen(model, ro, temperature=temperature, micro_batch=micro_batch)["logp"]

    def frozen(self, model, ro: Rollout, *, temperature: float, micro_batch: int, with_q: bool = False) -> dict:
        """{"logp": [N, T]} (and "qlogp" with ``with_q``: ``logprobs``) of the whole rollout under ``model``
        (reference or old policy) in inference mode: no activations kept, no autograd bookkeeping. Cloned
        outside it into normal tensors, which the loss may save for backward."""
        rows = torch.arange(ro.completion_ids.shape[0])  # [N]
        keys = ("logp", "qlogp") if with_q and self.processing is not None else ("logp",)
        # FSDP2 reuses its all-gather buffers in training, which must not be inference tensors
        with torch.no_grad() if self.sharded else torch.inference_mode():
            parts = [self.logprobs(model, ro, idx, temperature=temperature, with_q=len(keys) > 1)
                     for mb in rows.split(micro_batch) for idx in self.chunks(ro, mb)]
            out = {k: torch.cat([p[k] for p in parts]) for k in keys}  # [N, T] each
        return {k: v.clone() for k, v in out.items()}
