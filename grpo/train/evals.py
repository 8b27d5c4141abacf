"""Evaluation during training (eval_steps): the held-out set's greedy accuracy and pass@k as metrics
of the step's line (so in metrics.jsonl, TensorBoard and the report), and a few of its prompts with
their greedy completions and verifier values in eval_completions.jsonl."""

from __future__ import annotations

from grpo.infra.logger import EVAL_COMPLETIONS


def eval_metrics(result: dict) -> dict:
    """A result of grpo.eval.evaluate as metrics: eval/accuracy, eval/pass@k (when sampled; k is
    eval_pass_k), eval/mean_length, eval/truncated_share."""
    out = {"eval/accuracy": result["accuracy"], "eval/mean_length": result["mean_length"],
           "eval/truncated_share": result["truncated_share"]}
    if result.get("pass@k") is not None:
        out["eval/pass@k"] = result["pass@k"]
    for k, v in (result.get("tools") or {}).items():  # tools / environment runs: tools/call_rate, ...
        out[f"eval/{k}"] = v
    return out


def periodic_eval(result: dict, *, step: int, logger) -> dict:
    """Log the result's examples as the step's completions table; return its metrics."""
    logger.log_samples(step, [{k: ex.get(k) for k in ("prompt", "answer", "completion", "reward")}
                              for ex in result.get("examples", [])], file=EVAL_COMPLETIONS)
    return eval_metrics(result)
