"""A judge model as the only reward: `grpo serve` on loopback scores the arithmetic task's completions.

1. Starts `grpo serve MODEL` (default: the embedded SmolLM2-135M-Instruct) on 127.0.0.1 with a key, a
   deadline long enough that the served model itself answers (its own fallback), and no closing-marker check
   (a judge's "yes" is a complete answer).
2. The judge's agreement with the arithmetic verifier on --pairs held-out problems, each with a right
   and a wrong completion ("a + b = c"), for the built-in yes/no template and the two few-shot
   templates below (one over the whole reply, one over its final answer alone, `{final_answer}`): with
   judge_score=yes_no the share of completions scored as the verifier does; with
   judge_score=yes_prob (P(yes) / (P(yes) + P(no)) of the judge's one token) the share of pairs whose
   right completion scores above the wrong one, which is what a group-relative advantage reads.
3. A short `grpo train` whose reward is the judge alone, scored --score (default yes_prob) with
   --template (default final_answer: a judge that reads the whole reply is exploited by the policy's
   wording; `best`: the template that ranks best), with rewards=numeric,judge reward_weights=0,1 (the
   numeric verifier is logged and judges the held-out evaluation, with weight 0 in the reward), and its
   held-out greedy accuracy before and after.

    PYTHONPATH=. python bench/judge.py [--out /tmp/judge] [--steps 5] [--eval 50] [--pairs 20] [--port 8765]
                                 [--template final_answer|default|few_shot|best] [--model JUDGE]

A judge fine-tuned for the check (bench/judge_data.py writes its rows, `grpo sft` trains it) is served
with --model JUDGE_RUN/final.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from grpo.data.tasks import arithmetic_task
from grpo.serve.bench import wait_healthy
from grpo.rewards.judge import JudgeReward, JudgeSettings

KEY = "bench-judge-key"
FEW_SHOT = ("Check if the reply's final number equals the reference.\n"
            "Reference: 12\nReply: 7 + 5 = 12\nEqual: yes\n"
            "Reference: 9\nReply: 4 + 6 = 10\nEqual: no\n"
            "Reference: 15\nReply: The answer is 15.\nEqual: yes\n"
            "Reference: 8\nReply: 3 + 5 = 9\nEqual: no\n"
            "Reference: {answer}\nReply: {completion}\nEqual:")
# the same check over the reply's final answer alone (judge_template's {final_answer}): the policy's
# wording never reaches the judge, only the number it ends on
FINAL = ("Check if the answer equals the reference.\n"
         "Reference: 12\nAnswer: 12\nEqual: yes\n"
         "Reference: 9\nAnswer: 10\nEqual: no\n"
         "Reference: 15\nAnswer: 15\nEqual: yes\n"
         "Reference: 8\nAnswer: 9\nEqual: no\n"
         "Reference: {answer}\nAnswer: {final_answer}\nEqual:")
TEMPLATES = {"default": "", "few_shot": FEW_SHOT, "final_answer": FINAL}


def start_server(model: str, port: int, log: Path) -> subprocess.Popen:
    # the judge is its own fallback: the "base" lane (judge_model) must reach it, not the base model an
    # exported judge folder records
    cmd = [sys.executable, "-m", "grpo.cli", "serve", model, "--port", str(port), "--api-key", KEY, "--deadline", "600",
           "--closing-markers", "none", "--entropy-run", "0", "--max-batch", "16",
           "--fallback", model]
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    if wait_healthy(f"http://127.0.0.1:{port}", proc, timeout=600, name="grpo serve", log=str(log),
                    headers={"Authorization": f"Bearer {KEY}"}):
        return proc
    proc.kill()
    raise SystemExit(f"grpo serve did not come up within 10 minutes; see {log}")


def judge_model(score: str) -> str:
    """The served model's name: yes_prob asks one token, which the serving scheme would count as an
    answer cut at its cap and send to the fallback; "base" answers directly, with the fallback lane (the
    judge itself, start_server)."""
    return "base" if score == "yes_prob" else "grpo"


def agreement(url: str, template: str, pairs: int, score: str = "yes_no") -> float:
    """yes_no: the share of right/wrong completions the judge scores as the verifier does; yes_prob:
    the share of pairs whose right completion the judge scores above the wrong one."""
    rng = random.Random(0)
    samples, completions, truth = [], [], []
    for s in arithmetic_task(max_operand=20, ops="+", eval_size=200, seed=0).eval[:pairs]:
        a, b = s["prompt"].removeprefix("What is ").removesuffix("?").split(" + ")
        wrong = int(s["answer"]) + rng.choice([-2, -1, 1, 2])
        for value, right in ((s["answer"], 1.0), (wrong, 0.0)):
            samples.append(s)
            completions.append(f"{a} + {b} = {value}")
            truth.append(right)
    judge = JudgeReward(JudgeSettings(url=url, model=judge_model(score), template=template, score=score), timeout=600,
                        retries=1, concurrency=8)
    if "--show" in sys.argv:
        print([str(v)[:80] for v in judge(completions[:2], samples[:2])])
    scores = judge(completions, samples)
    if score == "yes_prob":
        ok = [isinstance(a, float) and isinstance(b, float) and a > b for a, b in zip(scores[::2], scores[1::2])]
        return sum(ok) / len(ok)
    return sum(isinstance(v, float) and v == t for v, t in zip(scores, truth)) / len(truth)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/judge")
    ap.add_argument("--model", default="embedded:SmolLM2-135M-Instruct", help="the judge served")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--eval", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--template", default="final_answer", choices=[*TEMPLATES, "best"], help="the run's template")
    ap.add_argument("--score", default="yes_prob", choices=["yes_no", "yes_prob"], help="judge_score of the run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", action="store_true", help="print the judge's first two scores")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ["GRPO_JUDGE_API_KEY"] = KEY
    url = f"http://127.0.0.1:{a.port}/v1"
    server = start_server(a.model, a.port, out / "serve.log")
    try:
        t0 = time.perf_counter()
        agree = {f"{name}/{score}": agreement(url, tpl, a.pairs, score) for score in ("yes_no", "yes_prob")
                 for name, tpl in TEMPLATES.items()}
        print(f"judge agreement with the verifier on {a.pairs} pairs (yes_no: completions scored as the verifier; "
              "yes_prob: pairs ranked right over wrong): "
              + ", ".join(f"{k} {v:.0%}" for k, v in agree.items()) + f" ({time.perf_counter() - t0:.0f} s)", flush=True)
        name = max(TEMPLATES, key=lambda n: agree[f"{n}/{a.score}"]) if a.template == "best" else a.template
        template = TEMPLATES[name]
        print(f"the run's template: {name}", flush=True)
        if not a.steps:  # --steps 0: the agreement only
            (out / "figures.json").write_text(json.dumps({"agreement": agree}, indent=2))
            return
        run = out / "run"
        with (out / "train.log").open("w") as log:
            subprocess.run([sys.executable, "-m", "grpo.cli", "train", f"output_dir={run}", "rewards=numeric,judge",
                            "reward_weights=[0,1]", f"judge_url={url}", f"judge_model={judge_model(a.score)}", f"judge_template={template}",
                            f"judge_score={a.score}", f"seed={a.seed}",
                            "reward_timeout=600", f"max_steps={a.steps}", f"eval_prompts={a.eval}", "eval_pass_prompts=0",
                            f"num_threads={a.threads}", "progress=false", "report_to=none"],
                           stdout=log, stderr=subprocess.STDOUT, check=True)
    finally:
        server.terminate()
        server.wait(timeout=60)
    ev = json.loads((run / "eval.json").read_text())
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    print(f"held-out greedy accuracy ({a.eval} prompts), judge as the only reward, {a.steps} steps: "
          f"{ev['before']['accuracy']:.1%} -> {ev['after']['accuracy']:.1%}")
    keys = [k for k in lines[0] if "judge" in k or "numeric" in k or k == "reward_failures"]
    for line in lines:
        print(f"step {line['step']}: " + ", ".join(f"{k}={line[k]}" for k in keys))
    (out / "figures.json").write_text(json.dumps({"agreement": agree, "eval": ev}, indent=2))


if __name__ == "__main__":
    main()
