"""A GRPO script as a TRL user writes it, run on grpo: only the import line differs from TRL's.

    python examples/trl_script.py [MODEL]

MODEL: a hub id or a model folder (default: grpo's embedded SmolLM2-135M-Instruct, dequantized into
~/.cache/grpo by any earlier `grpo train`; with TRL itself give a folder or hub id). The dataset is
60 sums for training and 40 held out, conversational prompts; the reward is TRL's form (a batch of
message completions and the dataset's `answer` column). Measured in docs/guides/trl.md.
"""

import os
import random
import re
import sys

from datasets import Dataset

from grpo import GRPOConfig, GRPOTrainer  # with TRL: from trl import GRPOConfig, GRPOTrainer

MODEL = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/grpo/SmolLM2-135M-Instruct")


def make_rows(n, rng):
    rows = []
    for _ in range(n):
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        rows.append({"question": f"What is {a} + {b}?", "answer": str(a + b)})
    return rows


rng = random.Random(1234)
train = Dataset.from_list(make_rows(60, rng))
test = Dataset.from_list(make_rows(40, rng))


def to_chat(row):
    return {"prompt": [{"role": "user", "content": row["question"]}]}


train, test = train.map(to_chat), test.map(to_chat)


def correctness_reward(completions, answer, **kwargs):
    """1.0 when the last number of the reply is the answer."""
    rewards = []
    for completion, gold in zip(completions, answer):
        numbers = re.findall(r"-?\d+", completion[0]["content"])
        rewards.append(1.0 if numbers and numbers[-1] == gold else 0.0)
    return rewards


def brevity_reward(completions, **kwargs):
    """A small bonus for replies under 60 characters."""
    return [0.2 if len(c[0]["content"]) < 60 else 0.0 for c in completions]


args = GRPOConfig(
    output_dir=os.environ.get("OUTPUT_DIR", "runs/trl-script"),
    learning_rate=3e-5,
    lr_scheduler_type="constant",
    per_device_train_batch_size=8,
    gradient_accumulation_steps=4,
    num_generations=8,
    max_completion_length=32,
    temperature=0.8,
    beta=0.04,
    loss_type="grpo",
    scale_rewards="group",
    max_steps=int(os.environ.get("MAX_STEPS", "15")),
    logging_steps=1,
    log_completions=True,
    save_strategy="no",
    report_to="none",
    use_cpu=True,
    bf16=False,
    seed=0,
)

trainer = GRPOTrainer(
    model=MODEL,
    reward_funcs=[correctness_reward, brevity_reward],
    args=args,
    train_dataset=train,
    eval_dataset=test,
)
result = trainer.train()
print(result)
