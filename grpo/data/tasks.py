"""Built-in tasks (``TASKS``: arithmetic, GSM8K, code, code_hard, calculator) and user datasets
(JSONL/JSON/Parquet files, hub ids).

A sample is a dict with at least "prompt" (text or a list of chat messages) and "answer" (the gold
answer as text); rewards receive the whole dict, so extra columns (tests, io, ...) pass through.
A built-in task is one entry of ``TASKS``: its samples, the rewards a run scores it with when
``rewards`` is not set, and the settings it needs (filled where the config leaves them at their
defaults). Adding a task is writing its function and registering its ``BuiltinTask``.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from grpo.data.prompt_fit import chat_messages, fit_rendered
from grpo.errors import ConfigError, DataError
from grpo.registry import Registry

GSM8K_HUB_ID = "openai/gsm8k"
DATASET_REWARDS = "numeric"  # a dataset's rewards unless `rewards` is set: its answer column as a number
BUILTIN_HELD_OUT = 200  # a built-in task's held-out prompts unless eval_prompts says otherwise
VERIFIERS = "verifiers:"  # task=verifiers:<environment id> (grpo.agent.verifiers_env)
HELD_OUT_SHARE, HELD_OUT_FLOOR, HELD_OUT_CEILING = 0.1, 5, 200  # a dataset's, by its size


def held_out_size(rows: int) -> int:
    """Held-out prompts of a dataset of ``rows`` when eval_prompts is not given: a tenth, at least
    HELD_OUT_FLOOR (a 30-row dataset keeps 5) and at most HELD_OUT_CEILING, never more than half
    (the rest trains)."""
    return min(HELD_OUT_CEILING, max(HELD_OUT_FLOOR, int(rows * HELD_OUT_SHARE)), rows // 2)


@dataclass
class Task:
    """Training samples and disjoint held-out samples of one task."""

    name: str
    train: list[dict]
    eval: list[dict]



def arithmetic_task(*, max_operand: int, ops: str, eval_size: int, seed: int) -> Task:
    """All problems 'a op b' with a, b in 1..max_operand, split by a seeded shuffle so the held-out
    problems never appear in training (a + b and b + a count as different problems)."""
    items = [(a, op, b) for a in range(1, max_operand + 1) for b in range(1, max_operand + 1) for op in ops]
    random.Random(f"arithmetic-{seed}").shuffle(items)
    if eval_size >= len(items):
        raise DataError(f"eval_prompts: {eval_size} held-out problems leave none to train on "
                        f"({len(items)} problems with arithmetic_max_operand={max_operand})")
    samples = [{"prompt": f"What is {a} {op} {b}?", "answer": str(eval(f"{a}{op}{b}"))} for a, op, b in items]
    return Task("arithmetic", train=samples[eval_size:], eval=samples[:eval_size])


# The worked exchange every calculator prompt shows (grpo.agent's call format renders it as messages:
# the question, the assistant's call, the result turn, the answer). Not a problem of the task itself.
CALCULATOR_EXAMPLE = {"question": "What is 12 * 34?", "call": {"name": "calc", "arguments": {"expression": "12 * 34"}},
                      "result": "408", "answer": "12 * 34 = 408"}


def calculator_task(*, eval_size: int, seed: int) -> Task:
    """Products a * b of a 2- or 3-digit a and a 2-digit b (11..999 x 11..99), which a small model
    gets wrong in its head, for the ``calculator`` tool: 4,000 problems drawn by a seeded generator,
    split by a seeded shuffle (the held-out problems never appear in training). Each sample carries
    ``tool_example``, the worked exchange shown before its question."""
    rng = random.Random(f"calculator-{seed}")
    pairs: set[tuple[int, int]] = set()
    while len(pairs) < 4000:
        pairs.add((rng.randint(11, 999), rng.randint(11, 99)))
    items = sorted(pairs)
    rng.shuffle(items)
    if eval_size >= len(items):
        raise DataError(f"eval_prompts: {eval_size} held-out problems leave none of {len(items)} to train on")
    samples = [{"prompt": f"What is {a} * {b}?", "answer": str(a * b), "tool_example": CALCULATOR_EXAMPLE}
               for a, b in items]
    return Task("calculator", train=samples[eval_size:], eval=samples[:eval_size])


CODE_TEMPLATES = [  # (what f returns, the reference body); k is the problem's constant
    ("x plus {k}", "x + {k}"), ("x times {k}", "x * {k}"), ("x minus {k}", "x - {k}"),
    ("the remainder of x divided by {k1}", "x % {k1}"), ("the larger of x and {k}", "max(x, {k})"),
    ("x squared plus {k}", "x * x + {k}"),
]


def code_task(*, eval_size: int, seed: int) -> Task:
    """Tiny programming problems for the code reward: 'write f(x) returning x plus 3' with assert tests
    (6 kinds x k in 1..8 = 48 problems). The held-out share is at most a quarter of them."""
    items = []
    for what, body in CODE_TEMPLATES:
        for k in range(1, 9):
            consts = {"k": k, "k1": k + 1}
            ref = eval(f"lambda x: {body.format(**consts)}")
            prompt = (f"Write a Python function f(x) that returns {what.format(**consts)} for an integer x. "
                      f"Answer with the function in a ```python code block.")
            items.append({"prompt": prompt, "answer": f"def f(x):\n    return {body.format(**consts)}\n",
                          "tests": [f"assert f({x}) == {ref(x)}" for x in (0, 3, 10, -4)]})
    random.Random(f"code-{seed}").shuffle(items)
    n_eval = min(eval_size, len(items) // 4)
    return Task("code", train=items[n_eval:], eval=items[:n_eval])


HARD_CODE_TEMPLATES = [  # (signature, what it returns, reference body, test inputs as Python literals; {k} {c} filled)
    ("f(xs)", "the sum of the elements of the list xs that are greater than {k}",
     "return sum(x for x in xs if x > {k})", ("[]", "[1, 5, 9]", "[-3, 10, 2, 7, {k}]", "[100]")),
    ("f(xs)", "how many elements of the list xs are divisible by {k}",
     "return sum(1 for x in xs if x % {k} == 0)", ("[]", "[1, 2, 3, 4, 5, 6, 12]", "[{k}, 7, -{k}]", "[0, 11]")),
    ("f(s)", "the string s with every character '{c}' removed",
     "return s.replace('{c}', '')", ("''", "'{c}b{c}'", "'hello {c}orld'", "'{c}{c}{c}'")),
    ("f(s)", "how many times the character '{c}' occurs in the string s",
     "return s.count('{c}')", ("''", "'{c}'", "'x{c}y{c}{c}'", "'none'")),
    ("f(xs)", "the largest element of the non-empty list xs minus the smallest, plus {k}",
     "return max(xs) - min(xs) + {k}", ("[4]", "[1, 9, 3]", "[-5, 5]", "[7, 7, 2, 10]")),
    ("f(s)", "the string s reversed and repeated {k} times",
     "return s[::-1] * {k}", ("''", "'ab'", "'xyz'", "'a b'")),
    ("f(xs)", "the list of the elements of xs at even positions (0, 2, 4, ...), each multiplied by {k}",
     "return [x * {k} for x in xs[::2]]", ("[]", "[1]", "[1, 2, 3, 4, 5]", "[-1, 0, 6]")),
    ("f(n)", "the sum of the digits of the integer n (ignore its sign), plus {k}",
     "return sum(int(d) for d in str(abs(n))) + {k}", ("0", "7", "1234", "-509")),
    ("f(s)", "the number of words in the string s (words are separated by spaces) longer than {k} characters",
     "return sum(1 for w in s.split() if len(w) > {k})", ("''", "'a bb ccc dddd'", "'hello world'", "'  x   yyyyyyyy '")),
    ("f(xs)", "the second largest distinct value of the list xs (it has at least two distinct values), plus {k}",
     "return sorted(set(xs))[-2] + {k}", ("[1, 2]", "[5, 5, 3, 9]", "[-1, -7, -3]", "[10, 20, 20, 30]")),
    # the `code` task's kinds, which the untrained embedded model mostly solves: the mix sets the start
    *[("f(x)", f"{what} for an integer x", f"return {body}", ("0", "3", "10", "-4")) for what, body in CODE_TEMPLATES],
]


def code_hard_task(*, eval_size: int, seed: int) -> Task:
    """Programming problems on lists, strings and digits (10 kinds) mixed with the ``code`` task's 6
    kinds of f(x), x 6 constants = 96 problems, assert tests at four inputs including empty ones: an
    untrained small model passes some, not most (measured: docs/benchmarks/index.md). The held-out share is at
    most a quarter."""
    items = []
    for sig, what, body, inputs in HARD_CODE_TEMPLATES:
        for k in range(1, 7):
            fill = {"k": k, "k1": k + 1, "c": "abcdef"[k - 1]}
            src = f"def {sig}:\n    {body.format(**fill)}\n"
            ns: dict = {}
            exec(src, ns)  # the task's own reference, to compute the expected values
            args = [eval(x.format(**fill)) for x in inputs]
            prompt = (f"Write a Python function {sig} that returns {what.format(**fill)}. "
                      f"Answer with the function in a ```python code block.")
            items.append({"prompt": prompt, "answer": src,
                          "tests": [f"assert f({a!r}) == {ns['f'](a)!r}" for a in args]})
    random.Random(f"code_hard-{seed}").shuffle(items)
    n_eval = min(eval_size, len(items) // 4)
    return Task("code_hard", train=items[n_eval:], eval=items[:n_eval])


def _gsm8k_gold(answer: str, where: str) -> str:
    if "####" not in answer:
        raise DataError(f"{where}: GSM8K answer has no '####' final answer")
    return answer.split("####")[-1].strip().replace(",", "")


def _find_local_gsm8k() -> Path | None:
    """$GRPO_GSM8K: a local copy of GSM8K's train.jsonl (rows with "question" and "answer"), else None."""
    env = os.environ.get("GRPO_GSM8K")
    if not env:
        return None
    if not Path(env).is_file():
        raise DataError(f"GRPO_GSM8K={env}: no such file (a GSM8K train.jsonl, or unset it to use the hub)")
    return Path(env)


def gsm8k_task(*, eval_size: int, seed: int) -> Task:
    """GSM8K: a local train.jsonl ($GRPO_GSM8K) split in two, else the hub's train/test."""
    local = _find_local_gsm8k()
    if local is not None:
        rows = read_rows(local)
        random.Random(f"gsm8k-{seed}").shuffle(rows)
        eval_rows, train_rows = rows[:eval_size], rows[eval_size:]
    else:
        from datasets import load_dataset

        train_rows = list(load_dataset(GSM8K_HUB_ID, "main", split="train"))
        eval_rows = list(load_dataset(GSM8K_HUB_ID, "main", split="test"))[:eval_size]

    def convert(rows, split):
        return [{"prompt": r["question"], "answer": _gsm8k_gold(r["answer"], f"gsm8k {split} row {i}"),
                 "solution": r["answer"]} for i, r in enumerate(rows)]

    return Task("gsm8k", train=convert(train_rows, "train"), eval=convert(eval_rows, "eval"))


def read_rows(path: Path) -> list[dict]:
    """Rows of a .jsonl, .json (a list of objects) or .parquet file; a bad line names its number."""
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        rows = []
        for i, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{i}: not valid JSON ({e.msg})") from None
        return rows
    if suffix == ".json":
        data = json.loads(path.read_text())
        if not isinstance(data, list):
            raise DataError(f"{path}: a .json dataset must be a list of objects")
        return data
    if suffix == ".parquet":
        from datasets import Dataset

        return list(Dataset.from_parquet(str(path)))
    raise DataError(f"{path}: unsupported file type {suffix!r}; use .jsonl, .json or .parquet")


def _hub_rows(source: str, split: str) -> list[dict]:
    """Rows of ``split`` of a hub dataset id, or of a local copy of a hub dataset repository (a folder
    of data files, as ``git clone`` of the repository gives): both through datasets.load_dataset."""
    from datasets import load_dataset

    try:
        return list(load_dataset(source, split=split))
    except ValueError as e:  # e.g. an unknown split: the message lists the ones there are
        raise DataError(f"{source}[{split}]: {e} (set task_split)") from None
    except Exception as e:  # not on the hub, no network, a folder without data files
        raise DataError(f"task: {source}[{split}]: cannot be loaded ({type(e).__name__}: {e})") from None


def user_task(source: str, *, prompt_field: str, answer_field: str, split: str, eval_size: int | None,
              seed: int) -> Task:
    """A local file or a hub dataset; the held-out part is a seeded slice that training never sees
    (``eval_size`` None: ``held_out_size`` of the dataset's rows)."""
    path = Path(source).expanduser()
    if path.is_dir() or (not path.exists() and re.fullmatch(r"[\w.-]+/[\w.-]+", source)):
        rows, where = _hub_rows(source, split), f"{source}[{split}]"
    elif path.exists():
        rows, where = read_rows(path), str(path)
    else:
        raise DataError(f"task: {source!r} is not a built-in task {list(TASKS)}, an existing file or "
                        f"dataset folder, or a hub dataset id (owner/name)")
    return rows_task(path.stem if path.exists() else source, rows, where=where, prompt_field=prompt_field,
                     answer_field=answer_field, eval_size=eval_size, seed=seed)


def rows_task(name: str, rows: list, *, where: str, prompt_field: str = "prompt", answer_field: str = "answer",
              eval_size: int | None = None, seed: int = 0) -> Task:
    """A task of dataset rows (dicts): each sample is the row with "prompt" and "answer" taken from
    ``prompt_field`` and ``answer_field``. A dataset without the default "answer" column in any row
    keeps its own columns (rewards of TRL's form read them by name). The held-out part is a seeded
    slice (``eval_size`` None: ``held_out_size``); a bad row is an error naming it and ``where``."""
    if not rows:
        raise DataError(f"{where}: the dataset is empty")
    optional = answer_field == "answer" and not any(isinstance(r, dict) and answer_field in r for r in rows)
    samples = []
    for i, row in enumerate(rows, start=1):
        for field in (prompt_field, answer_field):
            if not isinstance(row, dict) or (field not in row and not (field == answer_field and optional)):
                raise DataError(f"{where}: row {i} has no field {field!r} (set prompt_field/answer_field)")
        sample = {**row, "prompt": row[prompt_field]}
        if not optional:
            sample["answer"] = str(row[answer_field])
        samples.append(sample)
    random.Random(f"user-{seed}").shuffle(samples)
    eval_size = held_out_size(len(samples)) if eval_size is None else eval_size
    if eval_size >= len(samples):
        raise DataError(f"{where}: {len(samples)} rows leave nothing to train on after {eval_size} held out "
                        f"(lower eval_prompts)")
    return Task(name, train=samples[eval_size:], eval=samples[:eval_size])


def unseen(samples: list[dict], trained: list[dict]) -> list[dict]:
    """The samples whose prompt (text or chat messages) is not among the ``trained`` samples' prompts:
    what evaluating a run may score."""
    seen = {json.dumps(s["prompt"], sort_keys=True) for s in trained}
    return [s for s in samples if json.dumps(s["prompt"], sort_keys=True) not in seen]


@dataclass(frozen=True)
class TaskOptions:
    """What a built-in task's samples may depend on: the held-out size and the arithmetic knobs."""

    eval_size: int
    max_operand: int
    ops: str


@dataclass(frozen=True)
class TaskLoading:
    """How a run's task is loaded (``load_task``), each field its Config field's (default included:
    tests/test_settings_sources.py holds them equal): the arithmetic knobs, a dataset's fields and split."""

    max_operand: int = 20  # arithmetic_max_operand
    ops: str = "+"  # arithmetic_ops
    prompt_field: str = "prompt"  # prompt_field
    answer_field: str = "answer"  # answer_field
    split: str = "train"  # task_split


@dataclass(frozen=True)
class BuiltinTask:
    """A built-in task, an entry of ``TASKS``.

    make: (TaskOptions) -> Task, its samples (the held-out split fixed by the task alone).
    rewards: the comma-separated rewards a run on it is scored with when ``rewards`` is not set.
    presets: config values it needs, set where the config leaves them at their defaults (an explicit
      setting wins).
    doc: what it is (its function's docstring).
    """

    name: str
    make: Callable[[TaskOptions], Task]
    rewards: str
    presets: Mapping[str, Any] = field(default_factory=dict)
    doc: str = ""


TASKS: Registry[BuiltinTask] = Registry("built-in task", field="task")
# arithmetic: correctness (1.0), and 0.1 for stating a result at all (a format reward, as DeepSeek-R1
# pairs one with its accuracy reward). With correctness alone, 9 of 200 greedy answers of the default
# run stated none ('8 + 1 = 1 + 2', scored like any wrong answer) and were refused by grpo serve's
# completeness check; with it, none (docs/benchmarks: the default run)
TASKS.register(BuiltinTask(
    "arithmetic", lambda o: arithmetic_task(max_operand=o.max_operand, ops=o.ops, eval_size=o.eval_size, seed=0),
    rewards="numeric,stated_answer", doc=arithmetic_task.__doc__))
TASKS.register(BuiltinTask("gsm8k", lambda o: gsm8k_task(eval_size=o.eval_size, seed=0), rewards="numeric",
                           doc=gsm8k_task.__doc__))
TASKS.register(BuiltinTask("code", lambda o: code_task(eval_size=o.eval_size, seed=0), rewards="code",
                           doc=code_task.__doc__))
TASKS.register(BuiltinTask("code_hard", lambda o: code_hard_task(eval_size=o.eval_size, seed=0), rewards="code",
                           doc=code_hard_task.__doc__))
# calculator: an episode (the call, the tool's result turn, the answer) needs ~45 tokens, more than 32;
# a step of 32 two-turn episodes takes ~3x a default arithmetic step, and the training accuracy
# passes 90% by step 3 on the 2-core AVX2 CPU, so 10 steps and 100 held-out problems keep the whole
# default run within 15 minutes there
TASKS.register(BuiltinTask(
    "calculator", lambda o: calculator_task(eval_size=o.eval_size, seed=0), rewards="numeric",
    presets={"tools": "builtin:calculator", "max_completion_length": 64, "eval_max_new_tokens": 64,
             "eval_prompts": 100, "eval_pass_prompts": 20, "max_steps": 10},
    doc=calculator_task.__doc__))


def task_rewards(name: str) -> str:
    """The rewards a run on task ``name`` is scored with when ``rewards`` is not set: the built-in
    task's own, a verifiers environment's (its rubric, returned by its episodes: ``agent``), else
    DATASET_REWARDS."""
    if name.startswith(VERIFIERS):
        return "agent"
    return TASKS[name].rewards if name in TASKS else DATASET_REWARDS


def load_task(name: str, *, eval_size: int | None, loading: TaskLoading = TaskLoading()) -> Task:
    """The built-in task ``name`` (an entry of TASKS), else a dataset by path or hub id, loaded as
    ``loading`` says: the one way a task is loaded. The held-out split is fixed by the task alone, never
    by the run's seed, so runs with different seeds are evaluated on the same prompts. ``eval_size``
    None: BUILTIN_HELD_OUT for a built-in task, ``held_out_size`` for a dataset."""
    if name in TASKS:
        size = BUILTIN_HELD_OUT if eval_size is None else eval_size
        return TASKS[name].make(TaskOptions(size, max_operand=loading.max_operand, ops=loading.ops))
    if name.startswith(VERIFIERS):  # a verifiers environment's taskset (grpo.agent.verifiers_env)
        try:
            from grpo.data.verifiers_tasks import verifiers_rows
        except ImportError:
            raise ConfigError("task: a verifiers environment needs the verifiers package (pip install -e '.[envs]')") \
                from None
        return rows_task(name, verifiers_rows(name), where=name, eval_size=eval_size, seed=0)
    return user_task(name, prompt_field=loading.prompt_field, answer_field=loading.answer_field, split=loading.split,
                     eval_size=eval_size, seed=0)


def fit_prompt(tokenizer, prompt, system_prompt: str, max_length: int) -> str | list[int]:
    """``render_prompt``'s text, or where it is longer than ``max_length`` tokens, its token ids cut from
    the middle, what comes before the first user content kept (grpo.data.prompt_fit): the engine then
    takes them as they are."""
    return fit_rendered(tokenizer, render_prompt(tokenizer, prompt, system_prompt), chat_messages(prompt, system_prompt),
                        max_length)


def render_prompt(tokenizer, prompt, system_prompt: str = "") -> str:
    """Text the model continues: the chat template with a generation prompt when the tokenizer has
    one, else the plain prompt. ``prompt`` may already be a list of chat messages."""
    messages = chat_messages(prompt, system_prompt)
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "\n".join(m["content"] for m in messages) + "\n"
