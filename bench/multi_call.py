"""A task that needs two tool calls, before and after training (the embedded SmolLM2-135M-Instruct).

Each question asks for two facts about a made-up city, "What are the population and the area of Varo?";
the facts come only from two tools, ``population(city)`` and ``area(city)``, whose numbers are drawn per
city from a fixed seed, so the model cannot know them: an answer is right (reward 1) only when its
final text holds both numbers, half right (0.5) with one. A worked exchange before each question shows
a turn making both calls (``tool_example`` with ``calls``), on another city.

One ``grpo train`` subprocess, as a user runs it, evaluating the held-out questions (greedy) before and
after --steps steps. It
prints the held-out evaluation before and after (accuracy: both numbers; the tool metrics: calls and
turns per episode, two calls in one turn showing as 2 calls in 2 turns) and the CPU.

    PYTHONPATH=. python bench/multi_call.py [--out /tmp/multi_call] [--steps 20] [--eval 50]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

PY = [sys.executable, "-m", "grpo.cli"]
SYLLABLES = ["va", "ro", "ki", "len", "mo", "dar", "su", "bel", "tan", "ori", "zu", "pa", "nel", "go", "ri", "sha"]


def _cities() -> dict[str, tuple[int, int]]:
    rng = random.Random(7)
    names = sorted({(rng.choice(SYLLABLES) + rng.choice(SYLLABLES)).capitalize() for _ in range(400)})
    return {n: (rng.randint(1000, 99000), rng.randint(10, 990)) for n in names}


CITIES = _cities()


def population(city: str) -> str:
    """The population of a city.

    Args:
        city: the city's name, for example Varo
    """
    return str(CITIES[city][0]) if city in CITIES else f"unknown city {city!r}"


def area(city: str) -> str:
    """The area of a city in square kilometres.

    Args:
        city: the city's name, for example Varo
    """
    return str(CITIES[city][1]) if city in CITIES else f"unknown city {city!r}"


def both_values(completion: str, sample: dict) -> float:
    """1 when the final answer holds both numbers, 0.5 with one, else 0."""
    numbers = set(re.findall(r"\d+", completion))
    pop, ar = sample["answer"].split()
    return (float(pop in numbers) + float(ar in numbers)) / 2


def rows() -> list[dict]:
    names = list(CITIES)
    out = []
    for i, city in enumerate(names):
        other = names[(i + 1) % len(names)]
        example = {"question": f"What are the population and the area of {other}?",
                   "calls": [{"name": "population", "arguments": {"city": other}},
                             {"name": "area", "arguments": {"city": other}}]}
        pop, ar = CITIES[city]
        out.append({"prompt": f"What are the population and the area of {city}?", "answer": f"{pop} {ar}",
                    "tool_example": example})
    return out


def _grpo(*args: str, log: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    with log.open("w") as f:
        subprocess.run([*PY, *args], check=True, stdout=f, stderr=subprocess.STDOUT, env=env)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/multi_call")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--eval", type=int, default=50)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = out / "cities.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    common = [f"task={data}", "tools=bench.multi_call:population,bench.multi_call:area",
              "rewards=bench.multi_call:both_values", "max_turns=3", "max_completion_length=96",
              "eval_max_new_tokens=96", f"eval_prompts={args.eval}", "rollout_engine=fast", "seed=0"]
    _grpo("train", *common, f"output_dir={out / 'run'}", f"max_steps={args.steps}", "eval_steps=0",
          "log_completions_steps=1", "eval_pass_k=0", log=out / "train.log")
    result = json.loads((out / "run" / "eval.json").read_text())
    print(json.dumps({k: result[k] for k in ("before", "after")}, indent=1))
    print(f"cpu: {subprocess.run(['lscpu'], capture_output=True, text=True).stdout.split('Model name:')[1].splitlines()[0].strip()}")


if __name__ == "__main__":
    main()
