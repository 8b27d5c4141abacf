"""The learned critic of the PPO baseline: a value model, its optimizer, and its health metrics.

GRPO exists to remove this component (DeepSeekMath section 4.1); it is here so that users can
measure what removing it buys (`grpo compare`). Dimension letters: N sequences, T completion tokens.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from grpo import core
from grpo.policy import model_inputs


def load_value_model(path: str, dtype: torch.dtype) -> nn.Module:
    """A copy of the policy's architecture with a scalar head, initialised from the policy's weights
    (the head itself starts at zero so initial values are 0, not noise)."""
    from transformers import AutoModelForTokenClassification

    model = AutoModelForTokenClassification.from_pretrained(path, num_labels=1, dtype=dtype)
    head = getattr(model, "score", None) or getattr(model, "classifier", None)
    if isinstance(head, nn.Linear):
        with torch.no_grad():
            head.weight.zero_()
            if head.bias is not None:
                head.bias.zero_()
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = 0
    return model


class Critic:
    """Values V(s_t) of the state before each completion token, trained by a clipped value loss."""

    def __init__(self, path: str, *, dtype: torch.dtype, learning_rate: float, clip_range: float | None,
                 max_grad_norm: float, divergence_factor: float, autocast: bool):
        self.model = load_value_model(path, dtype)
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=learning_rate)
        self.clip_range, self.max_grad_norm = clip_range, max_grad_norm
        self.divergence_factor, self.autocast = divergence_factor, autocast
        self.min_loss = math.inf
        self.divergence_events = 0

    def _values(self, prompt_ids, prompt_mask, completion_ids, completion_mask) -> torch.Tensor:
        t_full = completion_ids.shape[1]
        inp = model_inputs(prompt_ids, prompt_mask, completion_ids, completion_mask)
        t = inp.pop("completion_ids").shape[1]
        with torch.autocast(completion_ids.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            out = self.model(**inp).logits  # [N, P' + T', 1]
        # the value of the state before completion token j sits at position P' - 1 + j
        values = out[:, -t - 1:-1, 0].float()  # [N, T']
        return torch.nn.functional.pad(values, (0, t_full - t))  # [N, T]

    @torch.no_grad()
    def values(self, ro, micro_batch: int) -> torch.Tensor:
        """Values at sampling time, [N, T], for GAE and as the clip anchor of the value loss."""
        parts = [self._values(ro.prompt_ids[i], ro.prompt_mask[i], ro.completion_ids[i], ro.completion_mask[i])
                 for i in torch.arange(ro.completion_ids.shape[0]).split(micro_batch)]
        return torch.cat(parts)

    def update(self, ro, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, *,
               micro_batch: int) -> dict:
        """One optimizer step of the clipped value loss over the batch, in micro-batches."""
        n = ro.completion_ids.shape[0]
        total_tokens = mask.sum().clamp(min=1)
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, clip_sum = 0.0, 0.0
        for idx in torch.arange(n).split(micro_batch):
            v = self._values(ro.prompt_ids[idx], ro.prompt_mask[idx], ro.completion_ids[idx],
                             ro.completion_mask[idx])  # [n, T]
            out = core.clipped_value_loss(v, old_values[idx], returns[idx], mask[idx], clip_range=self.clip_range)
            share = mask[idx].sum() / total_tokens  # token-weighted, so micro-batches add up to the batch
            (out["loss"] * share).backward()
            loss_sum += float(out["loss"].detach() * share)
            clip_sum += float(out["clip_fraction"] * share)
        max_norm = self.max_grad_norm if self.max_grad_norm > 0 else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        if math.isfinite(norm):
            self.optimizer.step()
        diverged = math.isfinite(self.min_loss) and loss_sum > self.divergence_factor * self.min_loss
        self.divergence_events += int(diverged)
        self.min_loss = min(self.min_loss, loss_sum)
        return {"value_loss": loss_sum, "value_clip_fraction": clip_sum, "value_grad_norm": norm,
                "critic_diverged": int(diverged), "critic_divergence_events": self.divergence_events}

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "min_loss": self.min_loss, "divergence_events": self.divergence_events}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.min_loss, self.divergence_events = state["min_loss"], state["divergence_events"]
