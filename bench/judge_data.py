"""Rows that fine-tune a small model into an equality judge with `grpo sft` (a generative reward
model trained on verifier labels, as verl's and ROLL's judges are), for bench/judge.py's run.

Each row is one chat exchange: the user turn is bench/judge.py's ``final_answer`` template rendered
exactly as the judge reward renders it for a completion (JudgeReward.render, with the completion's
``{final_answer}``), the assistant turn is "yes" or "no", the arithmetic task's numeric verifier's
verdict on that completion. Completions are drawn from the task's training problems only (the judge
run evaluates on held-out ones) in the forms a policy writes: right results, near misses, decimals
('5.33'), restated operands, numbers cut from the question, a restatement without a result; half are right (no reply
without any digit, whose final answer renders as "none").

    PYTHONPATH=. python bench/judge_data.py --out /tmp/judge-sft/rows.jsonl --seed 1 [--rows 2048]
    grpo sft sft_data=/tmp/judge-sft/rows.jsonl output_dir=/tmp/judge-sft/run learning_rate=2e-5 \
        warmup_steps=10 sft_epochs=1 sft_batch_size=16 per_device_train_batch_size=16 sft_eval_share=0.05
    PYTHONPATH=. python bench/judge.py --model /tmp/judge-sft/run/final --steps 15 --eval 100 --pairs 40

With 512 rows (2 epochs, lr 5e-5) the model memorised the rows and answered "no" to held-out ones; with
2048 rows in one epoch its held-out loss fell to 1e-4.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from bench.judge import FINAL
from grpo.data.tasks import arithmetic_task
from grpo.rewards.builtin import numeric_reward
from grpo.rewards.judge import JudgeReward, JudgeSettings, final_answer


def wrong_value(a: int, b: int, c: int, rng: random.Random) -> str:
    """A final answer that is not c, in one of the forms a small policy writes."""
    kind = rng.randrange(6)
    if kind == 0:
        return str(c + rng.choice([-3, -2, -1, 1, 2, 3]))
    if kind == 1:  # a decimal near the result
        return f"{c + rng.choice([-1, 0, 1])}.{rng.choice(['33', '5', '25', '1', '75'])}"
    if kind == 2:
        return str(rng.choice([a, b, a * b, abs(a - b)]) if rng.random() < 0.9 else c * 10)
    if kind == 3:
        return str(rng.randint(0, 99))
    if kind == 4:
        return f"-{c}"
    return f"{c}{rng.randint(0, 9)}"  # a digit too many


def completion(a: int, b: int, value: str, rng: random.Random) -> str:
    forms = [f"{a} + {b} = {value}", f"{a} + {b} = {value}.", f"The answer is {value}.", value,
             f"To add {a} and {b}, we get {value}.", f"{a} + {b} = {b} + {a} = {value}"]
    return rng.choice(forms)


def rows(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    judge = JudgeReward(JudgeSettings(url="http://127.0.0.1:9/v1", template=FINAL, score="yes_prob"), timeout=1)
    train = arithmetic_task(max_operand=20, ops="+", eval_size=200, seed=0).train
    out = []
    for i in range(count):
        s = rng.choice(train)
        a, b = (int(x) for x in s["prompt"].removeprefix("What is ").removesuffix("?").split(" + "))
        c = int(s["answer"])
        if i % 2 == 0:
            text = completion(a, b, rng.choice([str(c), str(c), f"{c}.0"]), rng)
        elif rng.random() < 0.1:  # no number stated as a result
            text = rng.choice([f"{a} + {b} = {a} + {b}", f"To add {a} and {b}, you simply add them together."])
        else:
            text = completion(a, b, wrong_value(a, b, c, rng), rng)
        verdict = "yes" if numeric_reward(text, s) > 0 else "no"
        content = judge.render(s, completion=text, final_answer=final_answer(text))
        out.append({"messages": [{"role": "user", "content": content}, {"role": "assistant", "content": verdict}]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/judge-sft/rows.jsonl")
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    data = rows(a.rows, a.seed)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in data))
    yes = sum(r["messages"][1]["content"] == "yes" for r in data)
    print(f"{len(data)} rows ({yes} yes, {len(data) - yes} no) -> {out}")


if __name__ == "__main__":
    main()
