"""The serving scheme's early stop: a completion ends once ``run_length`` consecutive tokens were drawn
from distributions whose entropy is below a threshold (seed 003, section 5.3: "3 consecutive tokens
with logit entropy below the threshold -> stop immediately").

Dimension letters: n rows decoded together, N rows, T completion tokens, V vocabulary.

Two forms of one rule: ``entropy_run_step`` advances per-row run counters by one decode step (the
serving loop calls it after each token), ``entropy_stop_lengths`` applies it to whole sequences of
entropies (what the step form must agree with).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def next_token_entropy(logits: Tensor) -> Tensor:
    """Entropy in nats of softmax(logits) of each row: logits [n, V] -> [n] float32."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # [n, V]
    return -(logp.exp() * logp).sum(-1)  # [n]


@dataclass
class EntropyRun:
    """Per-row state after a decode step."""

    run: Tensor  # [n] long: consecutive low-entropy tokens ending at this step
    stop: Tensor  # [n] bool: the run reached run_length at this step


def entropy_run_step(entropy: Tensor, run: Tensor, *, threshold: float, run_length: int) -> EntropyRun:
    """One step of the rule: entropy [n] of the distribution each row's new token came from, run [n]
    the counters before it. A token below ``threshold`` extends its row's run, any other resets it;
    ``run_length`` <= 0 disables the stop."""
    low = entropy < threshold  # [n]
    run = torch.where(low, run + 1, torch.zeros_like(run))  # [n]
    stop = run >= run_length if run_length > 0 else torch.zeros_like(low)  # [n]
    return EntropyRun(run=run, stop=stop)


def entropy_stop_lengths(entropy: Tensor, mask: Tensor, *, threshold: float, run_length: int) -> Tensor:
    """Tokens each row keeps under the rule: entropy, mask [N, T] (mask 1 on the row's tokens, a
    prefix). The row ends after the token that completes the first run of ``run_length`` tokens below
    ``threshold``; a row with no such run keeps all its tokens. Returns [N] long."""
    n, t = entropy.shape
    run = torch.zeros(n, dtype=torch.long, device=entropy.device)  # [N]
    kept = mask.long().sum(1)  # [N]
    stopped = torch.zeros(n, dtype=torch.bool, device=entropy.device)  # [N]
    for j in range(t):
        step = entropy_run_step(entropy[:, j], run, threshold=threshold, run_length=run_length)
        run = step.run
        first = step.stop & ~stopped & mask[:, j].bool()  # [N]
        kept = torch.where(first, torch.full_like(kept, j + 1), kept)
        stopped = stopped | first
    return kept
