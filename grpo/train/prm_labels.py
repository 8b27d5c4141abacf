"""Automatic step labels for a process reward model, as Math-Shepherd makes them (Wang et al. 2024, arXiv
2312.08935, section 3.3): a step is as good as the completions that reach the verified answer from it.

For each prompt, ``solutions`` solutions are sampled from the policy and split into steps (prm.split_steps).
From the end of each step but the last, ``continuations`` completions are sampled (the prompt, the solution
up to that step and the separator, continued by the policy) and each whole solution is verified. A step's
soft label is the share of its continuations the verifier accepts, its hard label whether any is; the
last step's label is the solution's own verdict. Every draw is keyed (rollout.keys.row_keys with the given
seed; steps 0 and 1 for solutions and continuations), so a labelling is repeated exactly by the same seed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from grpo.rewards.prm import split_steps


@dataclass(frozen=True)
class LabelSettings:
    """solutions: sampled per prompt; continuations: sampled from each step's end; separator: the step rule."""

    solutions: int = 4
    continuations: int = 4
    separator: str = "\n"
    seed: int = 0


def _verdicts(texts: list[str], samples: list[dict], verifier) -> list[bool]:
    """Whether the verifier gives each completion full credit (value >= 1; one it cannot score: False)."""
    from grpo.rewards import score_completions
    from grpo.rewards.verdict import first_applicable

    res = score_completions(texts, samples, {"verifier": verifier})
    return [bool(v >= 1.0) for v in first_applicable(res.per_reward, ["verifier"]).tolist()]


def label_steps(engine, samples: list[dict], prompts: list[str], verifier, sampling, s: LabelSettings) -> list[dict]:
    """One labelled solution per row with at least one step: {"prompt", "answer", "solution", "steps", "soft",
    "hard", "correct", "continuations" (each continued step's draws)}. ``prompts``: each sample's rendered
    prompt text; ``sampling``: the rollout SamplingSettings of every draw."""
    from grpo.rollout.keys import row_keys

    n = len(prompts) * s.solutions
    sol = engine.generate(prompts, group_size=s.solutions, sampling=sampling, keys=row_keys(s.seed, 0, 0, n))
    owners = [samples[i // s.solutions] for i in range(n)]
    return label_solutions(engine, sol.texts, owners, [prompts[i // s.solutions] for i in range(n)], verifier,
                           sampling, continuations=s.continuations, separator=s.separator, keys=(s.seed, 1))


def label_solutions(engine, solutions: list[str], owners: list[dict], prompts: list[str], verifier, sampling, *,
                    continuations: int, separator: str, keys: tuple[int, int], rows_per_call: int = 64) -> list[dict]:
    """Label given solutions (``owners``: each one's task row, ``prompts``: its rendered prompt) by continuations
    from each step's end, drawn with row_keys(*keys, ...) (at most ``rows_per_call`` a generate call; an engine whose
    keys fix each row's tokens draws the same whatever the split); the rows as ``label_steps`` returns them."""
    from grpo.rollout.keys import row_keys

    # a context is a prompt and up to a whole solution: room for both, so no context loses its question
    sampling = dataclasses.replace(sampling, max_prompt_length=sampling.max_prompt_length + sampling.max_new_tokens)
    correct = _verdicts(solutions, owners, verifier)
    starts, texts, split = [], [], []
    for i, text in enumerate(solutions):
        steps = split_steps(text, separator)
        split.append(steps)
        for _, end in steps[:-1]:  # every step but the last is continued
            starts.append((i, text[:end] + separator))
            texts.append(prompts[i] + text[:end] + separator)
    shares: dict[tuple[int, int], float] = {}
    drawn: dict[tuple[int, int], list[str]] = {}
    if texts:
        per = max(1, rows_per_call // continuations)  # contexts a call
        drawn_texts = [t for a in range(0, len(texts), per) for t in engine.generate(
            texts[a:a + per], group_size=continuations, sampling=sampling,
            keys=row_keys(*keys, a * continuations, len(texts[a:a + per]) * continuations)).texts]
        whole = [starts[j // continuations][1] + c for j, c in enumerate(drawn_texts)]
        ok = _verdicts(whole, [owners[starts[j // continuations][0]] for j in range(len(whole))], verifier)
        step_of: dict[int, int] = {}
        for j, (i, _) in enumerate(starts):
            k = step_of[i] = step_of.get(i, -1) + 1
            got = ok[j * continuations:(j + 1) * continuations]
            shares[i, k] = sum(got) / len(got)
            drawn[i, k] = drawn_texts[j * continuations:(j + 1) * continuations]
    rows = []
    for i, steps in enumerate(split):
        if not steps:
            continue
        soft = [shares[i, k] for k in range(len(steps) - 1)] + [float(correct[i])]
        rows.append({"prompt": owners[i]["prompt"], "answer": owners[i].get("answer"),
                     "solution": solutions[i], "steps": [t for t, _ in steps], "soft": soft,
                     "hard": [float(v > 0) for v in soft], "correct": correct[i],
                     "continuations": [drawn[i, k] for k in range(len(steps) - 1)]})
    return rows


def write_labels(rows: list[dict], path) -> None:
    """The labelled solutions as JSONL (what `grpo prm train` reads)."""
    import json
    from pathlib import Path

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
