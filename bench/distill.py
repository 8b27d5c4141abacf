"""On-policy distillation against GRPO on the built-in arithmetic task (the embedded SmolLM2-135M-Instruct).

1. The teacher: a `grpo train` run with the default settings but for --teacher-steps steps (or an
   existing run folder, --teacher RUN); its held-out greedy accuracy before (the untrained model) and
   after training (eval.json).
2. The student, the untrained model, trained --steps steps with policy_loss=distill teacher=RUN beta=0
   (the per-token reverse KL to the teacher on the student's own samples is the whole loss).
3. For comparison, GRPO alone (the default loss and reward) for the same --steps steps.

Every run evaluates the same held-out prompts (eval_prompts). Prints the accuracies, the student's
share of the teacher's accuracy, and the share of the teacher's gain over the untrained model that
each --steps-step run recovers.

    PYTHONPATH=. python bench/distill.py [--out /tmp/distill] [--teacher RUN] [--teacher-steps 8] [--steps 10] [--eval 50]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

PY = [sys.executable, "-m", "grpo.cli", "train"]


def train(out: Path, name: str, args: list[str]) -> dict:
    """A `grpo train` run in out/name (kept when it has finished already); its eval.json and seconds."""
    run = out / name
    t0 = time.perf_counter()
    if not (run / "eval.json").is_file() or "after" not in json.loads((run / "eval.json").read_text()):
        with (out / f"{name}.log").open("w") as log:
            subprocess.run([*PY, f"output_dir={run}", *args], stdout=log, stderr=subprocess.STDOUT, check=True)
    result = json.loads((run / "eval.json").read_text())
    return {"before": result["before"]["accuracy"], "after": result["after"]["accuracy"],
            "seconds": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/distill")
    ap.add_argument("--teacher", help="an existing run folder to distill from (default: train one)")
    ap.add_argument("--teacher-steps", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--eval", type=int, default=50, help="held-out prompts of every run")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    common = [f"eval_prompts={a.eval}", "eval_pass_prompts=0", f"num_threads={a.threads}", "progress=false",
              "report_to=none"]
    if a.teacher:
        ev = json.loads((Path(a.teacher) / "eval.json").read_text())
        teacher_run = Path(a.teacher)
        teacher = {"before": ev["before"]["accuracy"], "after": ev["after"]["accuracy"], "seconds": 0.0}
    else:
        teacher_run = out / "teacher"
        teacher = train(out, "teacher", [f"max_steps={a.teacher_steps}", *common])
    print(f"teacher ({teacher_run}): {teacher['before']:.1%} -> {teacher['after']:.1%}", flush=True)
    distill = train(out, "distill", [f"max_steps={a.steps}", "policy_loss=distill", f"teacher={teacher_run}",
                                     "beta=0", *common])
    print(f"distill, {a.steps} steps: {distill['before']:.1%} -> {distill['after']:.1%} "
          f"({distill['seconds']:.0f} s)", flush=True)
    grpo = train(out, "grpo", [f"max_steps={a.steps}", *common])
    print(f"GRPO alone, {a.steps} steps: {grpo['before']:.1%} -> {grpo['after']:.1%} ({grpo['seconds']:.0f} s)",
          flush=True)
    gain = teacher["after"] - teacher["before"]
    for name, r in (("distill", distill), ("GRPO", grpo)):
        closed = f", {(r['after'] - r['before']) / gain:.0%} of the teacher's gain" if gain > 0 else ""
        print(f"{name}: {r['after'] / max(teacher['after'], 1e-9):.0%} of the teacher's held-out accuracy{closed}")
    (out / "figures.json").write_text(json.dumps({"teacher": teacher, "distill": distill, "grpo": grpo}, indent=2))


if __name__ == "__main__":
    main()
