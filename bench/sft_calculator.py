"""Supervised warm-start before RL on the calculator task (the embedded SmolLM2-135M-Instruct).

1. 64 transcripts of the calculator task's training problems, written by the calculator itself: the
   system message the agent shows (the python call format's description of `calc`), the question,
   the assistant's call `calc(a * b)`, the tool turn with the value the real `calc` tool returned, and
   the final answer `a * b = value`. Rendered exactly as grpo.agent renders an episode's messages.
2. `grpo eval` of the untrained model on held-out calculator problems (the task's own held-out split,
   never in the transcripts), with the tool described in the system message and NO worked example
   (tool_example_call=none): tool-call rate (`tools/call_rate`: episodes with a well-formed call) and
   greedy accuracy.
3. `grpo sft` on the transcripts, then the same evaluation of its final/ folder.
4. A short `grpo train model=<sft>/final` on the task from there, and the same evaluation.

Prints every figure and the ratios. Every stage is a `grpo` subprocess, as a user would run it.

    PYTHONPATH=. python bench/sft_calculator.py [--out /tmp/sft_calc] [--eval 30] [--grpo-steps 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from grpo.agent.formats import CALL_FORMATS
from grpo.agent.tools import resolve_tools
from grpo.data.tasks import calculator_task

PY = [sys.executable, "-m", "grpo.cli"]


def transcripts(n: int) -> list[dict]:
    """``n`` chat rows from the calculator task's training split, the tool's results from the tool."""
    (tool,) = resolve_tools("builtin:calculator")
    fmt = CALL_FORMATS["python"]
    rows = []
    for sample in calculator_task(eval_size=100, seed=0).train[:n]:
        expression = sample["prompt"].removeprefix("What is ").removesuffix("?")
        call = fmt.call_message(tool.name, {"expression": expression})
        parsed = fmt.parse(fmt.render_call(tool.name, {"expression": expression}), {tool.name: tool})
        value = str(tool.fn(**parsed.arguments))
        assert value == sample["answer"], (value, sample)
        rows.append({"messages": [{"role": "system", "content": fmt.describe([tool])},
                                  {"role": "user", "content": sample["prompt"]}, call,
                                  *fmt.result_messages(parsed, value),
                                  {"role": "assistant", "content": f"{expression} = {value}"}]})
    return rows


def held_out_file(path: Path) -> Path:
    """The calculator task's held-out problems without their worked example (the tool is described in
    the system message only)."""
    rows = [{"prompt": s["prompt"], "answer": s["answer"]} for s in calculator_task(eval_size=100, seed=0).eval]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run(cmd: list[str], log: Path) -> tuple[str, float]:
    t0 = time.perf_counter()
    with log.open("w") as err:
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=os.environ.copy())
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}); see {log}")
    return out.stdout, time.perf_counter() - t0


def evaluate(model: str, task: Path, common: list[str], n_eval: int, log: Path) -> dict:
    stdout, secs = run([*PY, "eval", "--model", model, f"task={task}", f"eval_prompts={n_eval}", "eval_pass_prompts=0",
                        *common], log)
    res = json.loads(stdout[stdout.index("{"):])
    return {"accuracy": res["accuracy"], "call_rate": res["tools"]["tools/call_rate"], "seconds": secs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/sft_calculator")
    ap.add_argument("--transcripts", type=int, default=64)
    ap.add_argument("--eval", type=int, default=30, help="held-out problems evaluated")
    ap.add_argument("--epochs", type=float, default=3.0)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--grpo-steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    data = out / "transcripts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in transcripts(a.transcripts)))
    task = held_out_file(out / "held_out.jsonl")
    common = ["tools=builtin:calculator", "tool_format=python", "tool_example_call=none", "max_completion_length=64",
              "eval_max_new_tokens=64", f"num_threads={a.threads}", "progress=false", "report_to=none"]
    figures = {"untrained": evaluate("embedded:SmolLM2-135M-Instruct", task, common, a.eval, out / "eval0.log")}
    print("untrained:", figures["untrained"], flush=True)
    stdout, secs = run([*PY, "sft", f"sft_data={data}", f"output_dir={out / 'sft'}", f"sft_epochs={a.epochs}",
                        f"learning_rate={a.lr}", f"num_threads={a.threads}", "progress=false", "report_to=none"],
                       out / "sft.log")
    sft = json.loads(stdout[stdout.index("{"):stdout.rindex("}") + 1])
    print(f"sft: {sft['steps']} steps in {secs:.0f} s, loss {sft['train_loss_first']:.3f} -> {sft['train_loss_last']:.3f}",
          flush=True)
    figures["sft"] = evaluate(sft["final"], task, common, a.eval, out / "eval1.log")
    print("after sft:", figures["sft"], flush=True)
    if a.grpo_steps:
        run([*PY, "train", f"model={sft['final']}", f"task={task}", f"eval_prompts={a.eval}", "eval_pass_prompts=0",
             f"max_steps={a.grpo_steps}", f"output_dir={out / 'grpo'}", *common], out / "grpo.log")
        figures["sft+grpo"] = evaluate(str(out / "grpo"), task, common, a.eval, out / "eval2.log")
        print(f"after sft + {a.grpo_steps} GRPO steps:", figures["sft+grpo"], flush=True)
    base = figures["untrained"]["call_rate"]
    print(f"\ntool-call rate on {a.eval} held-out problems (greedy, no worked example): untrained {base:.0%} -> "
          f"after SFT on {a.transcripts} transcripts {figures['sft']['call_rate']:.0%}"
          + (f" -> after GRPO {figures['sft+grpo']['call_rate']:.0%}" if "sft+grpo" in figures else ""))
    print("accuracy: " + ", ".join(f"{k} {v['accuracy']:.0%}" for k, v in figures.items()))
    (out / "figures.json").write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
