"""Evaluation during training (eval_steps): the held-out set's greedy accuracy and pass@k as metrics
of the step's line (so in metrics.jsonl, TensorBoard and the report), and a few of its prompts with
their greedy completions and verifier values in eval_completions.jsonl."""

from __future__ import annotations

from grpo.infra.logger import EVAL_COMPLETIONS


def eval_metrics(result: dict, prefix: str = "eval/") -> dict:
    """A result of grpo.eval.evaluate as metrics: eval/accuracy, eval/pass@k (when sampled; k is
    eval_pass_k), eval/mean_length, eval/truncated_share; eval/interrupted and eval/prompts_scored
    when a stop request cut it short; each suite's (grpo.eval.suites) under eval/<suite>/."""
    out = {}
    for label, part in (result.get("suites") or {}).items():
        out.update({k: v for k, v in eval_metrics(part, f"{prefix}{label}/").items()
                    if not k.endswith("/interrupted")})
    if result.get("interrupted"):  # a partial evaluation, on its first prompts_scored prompts
        out.update({f"{prefix}interrupted": 1, f"{prefix}prompts_scored": result["prompts_scored"]})
        if not result["prompts_scored"]:
            return out  # nothing measured: no accuracy of 0 to plot
    out.update({f"{prefix}accuracy": result["accuracy"], f"{prefix}mean_length": result["mean_length"],
                f"{prefix}truncated_share": result["truncated_share"]})
    if result.get("pass@k") is not None:
        out[f"{prefix}pass@k"] = result["pass@k"]
    for k, v in (result.get("tools") or {}).items():  # tools / environment runs: tools/call_rate, ...
        out[f"{prefix}{k}"] = v
    return out


def eval_notes(result: dict, *, step: int) -> list[str]:
    """Lines for the run's log about an evaluation that did not score everything: completions its
    verifier could not score (counted as wrong) and a stop request that cut it short."""
    notes, scored = [], result["prompts_scored"]
    if result.get("verifier_failures"):
        notes.append(f"evaluation at step {step}: the verifier could not score {result['verifier_failures']} of "
                     f"{scored} greedy completions (counted as wrong; verifier_failures in eval.json)")
    if result.get("interrupted"):
        notes.append(f"evaluation at step {step} interrupted: {scored} of {result['n_prompts']} held-out prompts "
                     "scored (the result is marked \"interrupted\")")
    return notes


def periodic_eval(result: dict, *, step: int, logger) -> dict:
    """Log the result's examples as the step's completions table; return its metrics."""
    logger.log_samples(step, [{k: ex[k] for k in ("suite", "prompt", "answer", "completion", "reward", "transcript")
                               if k in ex} for ex in result.get("examples", [])], file=EVAL_COMPLETIONS)
    return eval_metrics(result)
