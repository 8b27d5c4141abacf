"""The reasoning-chain audit of a model on held-out problems: greedy numbered-step answers, the four
defect detectors (audit/defects.py) on each, and their densities per 100 completion tokens.

Accuracy alone hides how an answer was reached; the audit ("GRPO: not an upgrade of PPO but a
scalpel for LLM reasoning", Towards AI, 2025, section 5.2) samples 50 problems, asks for numbered
steps, and reports each defect kind per 100 tokens, pooled: the kind's findings over all answers
divided by all answers' completion tokens (the policy tokenizer's), times 100.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from grpo.audit.defects import KINDS, audit_completion
from grpo.data import render_prompt
from grpo.rewards import score_completions
from grpo.rollout import RolloutEngine, SamplingSettings

INSTRUCTIONS = {
    "en": "Solve it step by step. Number the steps (Step 1:, Step 2:, ...) and end with a line 'Answer: <number>'.",
    "zh": "请分步解答，给步骤编号（第一步：、第二步：……），最后一行写“答案：<数字>”。",
}


@dataclass(frozen=True)
class AuditSettings:
    """What the audit asks and how: ``problems`` held-out problems drawn with ``seed`` (all when
    fewer), the instruction appended to each prompt (``language``: a key of INSTRUCTIONS), greedy
    answers of at most ``max_new_tokens`` tokens, ``batch_size`` prompts per generate call."""

    problems: int = 50
    seed: int = 0
    language: str = "en"
    max_new_tokens: int = 256
    batch_size: int = 25
    system_prompt: str = ""
    max_prompt_length: int = 512


def pick_problems(samples: list[dict], count: int, seed: int) -> list[dict]:
    """``count`` held-out samples drawn at random with ``seed`` (the same ones for every model)."""
    if count >= len(samples):
        return list(samples)
    return random.Random(f"audit-{seed}").sample(samples, count)


def _with_instruction(prompt, instruction: str):
    """The prompt (text or chat messages) with the instruction appended to its last user turn."""
    if isinstance(prompt, str):
        return f"{prompt}\n\n{instruction}"
    messages = [dict(m) for m in prompt]
    last = max(i for i, m in enumerate(messages) if m.get("role") == "user")
    messages[last]["content"] = f"{messages[last]['content']}\n\n{instruction}"
    return messages


def densities(rows: list[dict]) -> dict:
    """Pooled densities per 100 tokens of each kind over audited rows (each with "tokens" and
    "counts"), with the totals behind them."""
    tokens = sum(r["tokens"] for r in rows)
    defects = {k: sum(r["counts"][k] for r in rows) for k in KINDS}
    return {"tokens": tokens, "defects": defects,
            "per_100_tokens": {k: 100.0 * v / tokens if tokens else math.nan for k, v in defects.items()}}


@torch.no_grad()
def audit_model(engine: RolloutEngine, problems: list[dict], verifier, settings: AuditSettings, *,
                verifier_name: str = "verifier") -> tuple[dict, list[dict]]:
    """Audit ``engine``'s greedy answers to ``problems``. Returns (summary, rows): the summary holds
    "problems", "accuracy" (the verifier's value >= 1), "tokens", "defects" and "per_100_tokens" per
    kind, "equations_checked", "mean_steps", "final_answer_share"; each row a problem with its
    completion, token count, correctness, step count and findings."""
    instruction = INSTRUCTIONS[settings.language]
    sampling = SamplingSettings(max_new_tokens=settings.max_new_tokens, max_prompt_length=settings.max_prompt_length, temperature=1.0)
    rows: list[dict] = []
    for lo in range(0, len(problems), settings.batch_size):
        chunk = problems[lo:lo + settings.batch_size]
        prompts = [render_prompt(engine.tokenizer, _with_instruction(s["prompt"], instruction), settings.system_prompt)
                   for s in chunk]
        ro = engine.generate(prompts, group_size=1, sampling=sampling, greedy=True)
        values = score_completions(ro.texts, chunk, {verifier_name: verifier},
                                   completion_ids=ro.completion_id_lists()).per_reward[verifier_name].tolist()
        for s, text, n_tok, v in zip(chunk, ro.texts, ro.lengths.tolist(), values):
            a = audit_completion(text, s["prompt"] if isinstance(s["prompt"], str) else json.dumps(s["prompt"]))
            rows.append({"prompt": s["prompt"], "answer": s.get("answer"), "completion": text, "tokens": int(n_tok),
                         "correct": bool(v >= 1.0), "steps": sum(st.number is not None for st in a.steps),
                         "final_answer": a.final_answer, "equations_checked": a.equations_checked,
                         "counts": a.counts(), "findings": [asdict(f) for f in a.findings]})
    n = max(len(rows), 1)
    summary = {"problems": len(rows), "accuracy": sum(r["correct"] for r in rows) / n, **densities(rows),
               "equations_checked": sum(r["equations_checked"] for r in rows),
               "mean_steps": sum(r["steps"] for r in rows) / n,
               "final_answer_share": sum(r["final_answer"] is not None for r in rows) / n,
               "mean_tokens": sum(r["tokens"] for r in rows) / n}
    return summary, rows


def write_audit(out_dir: Path, results: dict[str, tuple[dict, list[dict]]], meta: dict) -> Path:
    """audit.json (``meta`` and each audited model's summary, by label) and audit_samples.jsonl (every
    row with its model's label) in ``out_dir``; returns audit.json's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "audit.json"
    path.write_text(json.dumps({**meta, "models": {label: s for label, (s, _) in results.items()}}, indent=2))
    with open(out_dir / "audit_samples.jsonl", "w") as f:
        for label, (_, rows) in results.items():
            for r in rows:
                f.write(json.dumps({"model": label, **r}, ensure_ascii=False) + "\n")
    return path


def format_table(audit: dict) -> str:
    """The audit's models side by side: accuracy, then each kind's density per 100 tokens."""
    labels = list(audit["models"])
    lines = [f"{'':<28}" + "".join(f"{label:>14}" for label in labels)]
    rows = [("accuracy", "accuracy"), ("mean tokens", "mean_tokens"), ("mean steps", "mean_steps")]
    for name, key in rows:
        lines.append(f"{name:<28}" + "".join(f"{audit['models'][m][key]:>14.3g}" for m in labels))
    for k in KINDS:
        lines.append(f"{k + ' / 100 tokens':<28}" + "".join(
            f"{audit['models'][m]['per_100_tokens'][k]:>14.3f}" for m in labels))
    return "\n".join(lines)


AUDIT_HEADER = ["run", "model", "problems", "accuracy", "mean tokens", *[f"{k} / 100 tokens" for k in KINDS]]


def audit_rows(runs: list[dict]) -> list[list]:
    """`grpo report`'s audit table: one row per run and audited model (each run's "audit": its
    audit.json, or {})."""
    rows = []
    for run in runs:
        for label, s in (run.get("audit") or {}).get("models", {}).items():
            rows.append([run["name"], label, s["problems"], s["accuracy"], s["mean_tokens"],
                         *[s["per_100_tokens"][k] for k in KINDS]])
    return rows
