"""The data filter's selection (pure): problems with enough logical steps, and anchor answers by
pairwise win rate among candidates from several models.

It follows the data preparation of "GRPO: not an upgrade of PPO but a scalpel for LLM reasoning"
(Towards AI, 2025, section 3.2): keep only problems with a multi-step derivation (at least three
logical jumps, found by a connective detector), then have several models answer each one, score
every pair of answers by a reward model, and keep the answers that win more than 80% of their
comparisons as high-quality anchors and those that win less than 20% as typical errors.
"""

from __future__ import annotations

import math

from grpo.data.logic import logical_steps

SOLUTION_FIELDS = ("solution", "rationale", "explanation")


def reasoning_text(row: dict) -> str:
    """The text whose steps are counted: the row's worked solution when it has one (GSM8K's
    "solution"), else its prompt (chat messages joined)."""
    for key in SOLUTION_FIELDS:
        if isinstance(row.get(key), str) and row[key].strip():
            return row[key]
    prompt = row.get("prompt", "")
    if isinstance(prompt, list):
        return "\n".join(str(m.get("content", "")) for m in prompt if isinstance(m, dict))
    return str(prompt)


def connective_filter(rows: list[dict], *, min_steps: int = 3) -> tuple[list[dict], dict]:
    """The rows whose reasoning text has at least ``min_steps`` logical steps (``logical_steps``),
    each with its count as "logical_steps", and the counts kept and seen."""
    kept = []
    for row in rows:
        steps = logical_steps(reasoning_text(row))
        if steps >= min_steps:
            kept.append({**row, "logical_steps": steps})
    return kept, {"rows": len(rows), "kept": len(kept), "kept_share": len(kept) / max(len(rows), 1)}


def win_rates(scores: list[float]) -> list[float]:
    """Each candidate's share of pairwise comparisons won against the others of its problem: a
    higher score wins (1), an equal one ties (1/2). One candidate alone: 0.5."""
    n = len(scores)
    if n < 2:
        return [0.5] * n
    out = []
    for i, s in enumerate(scores):
        wins = sum(1.0 if s > t else 0.5 if s == t else 0.0 for j, t in enumerate(scores) if j != i)
        out.append(wins / (n - 1))
    return out


def select_anchors(candidates: list[dict], *, high: float = 0.8, low: float = 0.2) -> dict:
    """Given one problem's candidates (dicts with "score", None for one the judge could not score), add each one's "win_rate" and return
    {"candidates", "anchor_high": those winning more than ``high``, "anchor_low": less than ``low``}."""
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError(f"select_anchors: need 0 <= low <= high <= 1, got low={low}, high={high}")
    scores = [-math.inf if c["score"] is None else c["score"] for c in candidates]  # unscored: loses
    rated = [{**c, "win_rate": w} for c, w in zip(candidates, win_rates(scores))]
    return {"candidates": rated, "anchor_high": [c for c in rated if c["win_rate"] > high],
            "anchor_low": [c for c in rated if c["win_rate"] < low]}
