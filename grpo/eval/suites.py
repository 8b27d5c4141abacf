"""Evaluation on several suites: each suite's held-out prompts evaluated with its own verifier (and
its own tools or environment), its result kept under its label; the combined result's accuracy is
over every prompt scored, so one number still summarises the run."""

from __future__ import annotations

from dataclasses import dataclass, field

from grpo.eval.evaluate import EvalSettings, Interrupt, evaluate

SUMMED = ("n_prompts", "prompts_scored", "verifier_failures", "prompts_truncated")
BY_PROMPT = ("accuracy", "mean_length", "truncated_share")  # means over the prompts scored


@dataclass
class Suite:
    """A named set of held-out samples; ``verifiers``: the rewards whose first applicable value
    judges a completion (grpo.rewards.verdict); ``agent``: the AgentSampler that samples it (None:
    single-turn generation)."""

    label: str
    samples: list[dict]
    verifiers: dict
    agent: object = field(default=None, repr=False)


def combine(results: dict[str, dict]) -> dict:
    """One result of several suites' (label -> evaluate's result): counts summed, accuracy, mean
    length and truncated share over every prompt scored, pass@k over every prompt of the suites that sampled it,
    the examples tagged with their suite, each suite's own result under "suites"."""
    out: dict = {k: sum(r.get(k) or 0 for r in results.values()) for k in SUMMED}
    scored = max(out["prompts_scored"], 1)
    for key in BY_PROMPT:
        out[key] = sum((r.get(key) or 0.0) * r["prompts_scored"] for r in results.values()) / scored
    sampled = [r for r in results.values() if r.get("pass@k") is not None]
    out["pass_prompts"] = sum(r.get("pass_prompts", 0) for r in sampled)
    out["pass@k"] = (sum(r["pass@k"] * r.get("pass_prompts", 0) for r in sampled) / out["pass_prompts"]
                     if out["pass_prompts"] else None)  # over every prompt sampled, as accuracy is
    out["k"] = next((r["k"] for r in results.values()), 0)
    out["seconds"] = sum(r.get("seconds", 0.0) for r in results.values())
    out["examples"] = [{**ex, "suite": label} for label, r in results.items() for ex in r.get("examples", [])]
    if any(r.get("interrupted") for r in results.values()):
        out["interrupted"] = True
    out["suites"] = results
    return out


def evaluate_suites(engine, suites: list[Suite], settings: EvalSettings, *, interrupt: Interrupt | None = None) -> dict:
    """Every suite evaluated with the run's evaluation ``settings`` (``evaluate``), until a stop request
    (the suites after it are left out), combined (``combine``)."""
    results: dict[str, dict] = {}
    for suite in suites:
        results[suite.label] = evaluate(engine, suite.samples, suite.verifiers, settings, agent=suite.agent,
                                        interrupt=interrupt)
        if results[suite.label].get("interrupted"):
            break
    return combine(results)
