"""Training a process reward model on labelled steps (`grpo prm label`'s JSONL), Math-Shepherd's way: the
model reads ``question step_1 TAG\\n step_2 TAG\\n ...`` (prm.prm_input) and learns, at each tag, the step's
label as the probability of the good word against the bad one (cross-entropy of the two-word softmax
against the soft label, or the hard one). A held-out share of the solutions measures the step accuracy:
a step predicted good (p > 0.5) where its label is good (>= 0.5), and bad where bad. The folder written is
a model folder with prm.json, which ``step_reward=prm:FOLDER`` scores with.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from grpo.errors import ConfigError, DataError
from grpo.rewards.prm import PRMSpec, label_ids, step_accuracy, step_loss


@dataclass(frozen=True)
class PRMTrainSettings:
    """epochs over the training solutions; lr: AdamW's rate; batch: solutions per step; label: soft or hard;
    heldout: the share of solutions kept out for the step accuracy; seed: the split and the order."""

    epochs: int = 3
    lr: float = 1e-4
    batch: int = 4
    label: str = "soft"
    heldout: float = 0.1
    seed: int = 0


def read_labels(path: Path) -> list[dict]:
    """The labelled solutions; a row without steps and labels of the same length is an error naming it."""
    rows = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row.get("steps"), list) or len(row["steps"]) != len(row.get("soft") or []):
            raise DataError(f"{path}: line {n}: needs 'steps' and 'soft' labels of the same length")
        rows.append(row)
    if not rows:
        raise DataError(f"{path}: no labelled solutions")
    return rows


def train_prm(model, tok, rows: list[dict], spec: PRMSpec, s: PRMTrainSettings) -> dict:
    """Train ``model`` in place on ``rows``; returns the held-out step accuracy before and after and the losses."""
    if s.label not in ("soft", "hard"):
        raise ConfigError(f"--label: {s.label!r} is not valid; choose soft or hard")
    ids = label_ids(tok, spec)
    order = list(range(len(rows)))
    random.Random(s.seed).shuffle(order)
    cut = max(1, round(s.heldout * len(rows))) if s.heldout > 0 and len(rows) > 1 else 0
    held, train = [rows[i] for i in order[:cut]], [rows[i] for i in order[cut:]]
    model.eval()
    before = step_accuracy(model, tok, held, spec, ids)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=s.lr)
    gen, losses = torch.Generator().manual_seed(s.seed), []
    model.train()
    for _ in range(s.epochs):
        for b in torch.randperm(len(train), generator=gen).split(s.batch):
            batch = [train[i] for i in b.tolist()]
            loss = step_loss(model, tok, batch, spec, ids, label=s.label)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    model.eval()
    return {"train_solutions": len(train), "heldout_solutions": len(held), "heldout_steps": sum(len(r["steps"]) for r in held),
            "step_accuracy_before": before, "step_accuracy_after": step_accuracy(model, tok, held, spec, ids),
            "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None}
