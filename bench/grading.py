"""Grading throughput of one training step on this machine: a step's worth of programs of the built-in
``code_hard`` task (``--prompts`` x ``--group`` completions, each with its problem's assert tests)
graded in the sandbox with one slot (serial: one test at a time) and with one slot per core (the
grader's default: the step's programs and tests run concurrently up to the cores). The peer is the
serial run; modes alternate over ``--repeats`` rounds and each one's median is taken.

A group mixes what a policy samples: correct programs, wrong ones, one that raises and one that
does not parse (graded without a sandbox). Prints one JSON object: seconds per mode, the ratio
serial / concurrent, the sandboxed test runs, the CPU's AVX-512 flags, date and commit.

    nice -n 5 python bench/grading.py --prompts 4 --group 8 --repeats 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time

from machine import commit, cpu_line  # bench/machine.py


def step_completions(task, prompts: int, group: int) -> tuple[list[str], list[dict]]:
    """``group`` completions for each of the first ``prompts`` training problems: half correct (the
    reference), a quarter wrong, one raising, one that does not parse."""
    completions, samples = [], []
    for sample in task.train[:prompts]:
        ref = sample["answer"]
        sig = ref.splitlines()[0]
        kinds = [ref] * (group // 2) + [f"{sig}\n    return None\n"] * (group // 4)
        kinds += [f"{sig}\n    raise ValueError('no')\n", f"{sig}\n    return (\n"]
        for code in kinds[:group]:
            completions.append(f"Here is the function.\n```python\n{code}```")
            samples.append(sample)
    return completions, samples


def main() -> None:
    from grpo.data.tasks import code_hard_task
    from grpo.rewards.code import CodeGrader, available_cores, grade_batch

    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    completions, samples = step_completions(code_hard_task(eval_size=24, seed=0), args.prompts, args.group)
    cores = available_cores()
    graders = {"serial": CodeGrader(slots=1), "concurrent": CodeGrader(slots=cores)}
    for g in graders.values():
        g.check()
    seconds: dict[str, list[float]] = {k: [] for k in graders}
    scores = {}
    for _ in range(args.repeats):
        for name, grader in graders.items():
            t0 = time.perf_counter()
            scores[name] = grade_batch(grader, completions, samples, strict=False)
            seconds[name].append(time.perf_counter() - t0)
    assert scores["serial"] == scores["concurrent"], "the two modes graded differently"
    med = {k: statistics.median(v) for k, v in seconds.items()}
    runs = sum(len(s["tests"]) for c, s in zip(completions, samples) if "return (\n" not in c)
    print(json.dumps({
        "programs": len(completions), "sandboxed_test_runs": runs,
        "mean_score": sum(scores["serial"]) / len(completions), "cores": cores,
        "seconds": {k: [round(x, 2) for x in v] for k, v in seconds.items()},
        "median_seconds": {k: round(v, 2) for k, v in med.items()},
        "serial_over_concurrent": round(med["serial"] / med["concurrent"], 2),
        "cpu": cpu_line(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
        "commit": commit()}, indent=2))


if __name__ == "__main__":
    main()
