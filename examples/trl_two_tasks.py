"""A TRL-form two-task script run on grpo: one dataset whose `task` column says which task a row is,
one reward function per task that returns None on the other task's rows (TRL's "not applicable"),
and two environment classes in a dict `environment_factory` routed by that column. Only the import
line differs from TRL's.

    python examples/trl_two_tasks.py [MODEL]

The tasks: sums a + b (no tool: its environment has no public method) and products of a 3-digit and
a 2-digit number with a `multiply` tool. grpo logs each task's share of the batch, reward and
accuracy (share/<task>, reward/<task>, accuracy/<task>) and evaluates each task's held-out rows as a
suite (eval/<task>/accuracy). Measured in docs/guides/mixtures.md.
"""

import os
import random
import re
import sys

from grpo import GRPOConfig, GRPOTrainer  # with TRL: from trl import GRPOConfig, GRPOTrainer

MODEL = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/grpo/SmolLM2-135M-Instruct")


def make_rows(n, rng):
    rows = []
    for _ in range(n):
        a, b = rng.randint(1, 50), rng.randint(1, 50)
        rows.append({"prompt": f"What is {a} + {b}?", "answer": str(a + b), "task": "arithmetic"})
        a, b = rng.randint(100, 999), rng.randint(11, 99)
        rows.append({"prompt": f"What is {a} * {b}?", "answer": str(a * b), "task": "calculator"})
    return rows


def setting(name, default):
    """A positive whole number from the environment variable ``name`` (bench/trl_two_tasks.py sets them)."""
    value = os.environ.get(name, str(default))
    if not value.isdigit() or int(value) < 1:
        raise SystemExit(f"{name}={value!r}: a whole number >= 1")
    return int(value)


rng = random.Random(7)
train, test = make_rows(100, rng), make_rows(setting("HELD_OUT", 20), rng)  # rows per task


class SumEnv:
    """The sums' environment: nothing to call."""

    def reset(self, **kwargs):
        return None


class MultiplyEnv:
    """The products' environment: a multiplication tool."""

    def reset(self, **kwargs):
        return None

    def multiply(self, a: int, b: int) -> str:
        """Multiply two integers.

        Args:
            a: the first factor, for example 123
            b: the second factor, for example 45
        """
        return str(int(a) * int(b))


def _last_number(completion):
    text = completion if isinstance(completion, str) else completion[-1]["content"]
    numbers = re.findall(r"-?\d+", text.replace(",", ""))
    return numbers[-1] if numbers else None


def sum_reward(completions, answer, task, **kwargs):
    """1.0 when the reply's last number is the sum; None on the other task's rows."""
    return [None if t != "arithmetic" else float(_last_number(c) == a) for c, a, t in zip(completions, answer, task)]


def product_reward(completions, answer, task, **kwargs):
    """1.0 when the final reply's last number is the product; None on the other task's rows."""
    return [None if t != "calculator" else float(_last_number(c) == a) for c, a, t in zip(completions, answer, task)]


if __name__ == "__main__":  # importable: bench/trl_two_tasks.py writes warm-start transcripts from its classes
    args = GRPOConfig(
        output_dir=os.environ.get("OUTPUT_DIR", "runs/trl-two-tasks"),
        learning_rate=float(os.environ.get("LEARNING_RATE", "3e-5")),
        num_generations=8,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=setting("PROMPTS_PER_STEP", 4),  # 8 completions = 1 prompt
        max_completion_length=64,
        eval_max_new_tokens=64,  # grpo's name (TRL has no held-out greedy evaluation of its own)
        temperature=0.8,
        beta=0.04,
        max_steps=setting("MAX_STEPS", 8),
        eval_strategy="no",
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=int(os.environ.get("SEED", "0")),
    )

    trainer = GRPOTrainer(
        model=MODEL,
        reward_funcs=[sum_reward, product_reward],
        args=args,
        train_dataset=train,
        eval_dataset=test,
        environment_factory={"arithmetic": SumEnv, "calculator": MultiplyEnv},
    )
    result = trainer.train()
    for when in ("before", "after"):
        print(when, {name: round(r["accuracy"], 3) for name, r in result[when]["suites"].items()})
