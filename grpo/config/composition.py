"""Which features run together: every pair of ``FEATURES`` runs, or is refused for the reason
``REFUSALS`` gives. Validation refuses a pair by reading this table (``refused``: config/validate.py
on one process, ``validate_world`` on several), the composition page (docs/guides/composition.md) is
written from it by ``python -m grpo.docs``, and tests/test_composition.py meets every refusal it lists
and trains pairs it does not: the table, the page and the code cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Callable

from grpo.agent.environments import is_routed
from grpo.data.mixture import parse_mixture


@dataclass(frozen=True)
class Feature:
    """A feature a run may turn on: ``on(config, processes)`` says whether it is on; ``fields`` turn it
    on (what the tests and the page use); ``processes``: the torchrun processes it needs."""

    name: str
    doc: str
    on: Callable[[Any, int], bool]
    fields: dict = field(default_factory=dict)
    processes: int = 1


@dataclass(frozen=True)
class Refusal:
    """A pair that does not run: the config ``field`` its error names and why; ``when``: only where the
    config also says so (None: always)."""

    pair: tuple[str, str]
    field: str
    reason: str
    when: Callable[[Any], bool] | None = None
    when_doc: str = ""


FEATURES: tuple[Feature, ...] = (
    Feature("async", "asynchronous rollouts (`async_rollouts`)", lambda c, n: c.async_rollouts,
            {"async_rollouts": True}),
    Feature("lora", "LoRA adapters (`use_peft`)", lambda c, n: c.use_peft and not c.load_in_4bit, {"use_peft": True}),
    Feature("qlora", "LoRA on a 4-bit base (`load_in_4bit`)", lambda c, n: c.load_in_4bit,
            {"use_peft": True, "load_in_4bit": True}),
    Feature("ddp", "2 processes, DDP (`torchrun`)", lambda c, n: n > 1 and c.distributed_strategy == "ddp",
            {"distributed_strategy": "ddp"}, processes=2),
    Feature("fsdp2", "2 processes, FSDP2 (`distributed_strategy=fsdp2`)",
            lambda c, n: n > 1 and c.distributed_strategy == "fsdp2", {"distributed_strategy": "fsdp2"}, processes=2),
    Feature("mixture", "a mixture of tasks (`task=a:w,b:w`)", lambda c, n: parse_mixture(c.task) is not None,
            {"task": "arithmetic:0.5,calculator:0.5"}),
    Feature("routed", "TRL's dict `environment_factory` (rows routed to environments)",
            lambda c, n: is_routed(str(c.environment_factory or "")), {}),
    Feature("tools", "tools (`tools`)", lambda c, n: bool(str(c.tools).strip()), {"tools": "builtin:calculator"}),
    Feature("dynamic_sampling", "DAPO dynamic sampling (`dynamic_sampling`)", lambda c, n: c.dynamic_sampling,
            {"dynamic_sampling": True}),
    Feature("difficulty_sampling", "the difficulty sampler (`difficulty_sampling`)", lambda c, n: c.difficulty_sampling,
            {"difficulty_sampling": True}),
    Feature("reward_model_training", "reward-model training (`reward_model_train_steps`)",
            lambda c, n: c.reward_model_train_steps > 0,
            {"reward_model_train_steps": 1, "ref_reset_steps": 1, "rewards": "reward_model"}),
    Feature("teacher", "on-policy distillation (`teacher`)", lambda c, n: bool(c.teacher), {}),
)
BY_NAME = {f.name: f for f in FEATURES}

PEFT_RESET = "with use_peft the reference is the frozen base model and cannot be reset; use full fine-tuning or " \
             "ref_reset_steps=0"  # config/validate.py's rule, met first
TEACHER_RESET = "the teacher is the run's reference and is never replaced by the policy; set ref_reset_steps=0 " \
                "with a teacher"  # config/validate_sft.py's rule, met first
REFUSALS: tuple[Refusal, ...] = (
    Refusal(("ddp", "fsdp2"), "distributed_strategy", "one strategy per run: ddp or fsdp2"),
    Refusal(("mixture", "routed"), "environment_factory",
            "a mixture already routes each row to its source, and each source names its own environment "
            "(a source's environment_factory); the dict form routes the rows of one dataset"),
    Refusal(("lora", "qlora"), "load_in_4bit", "QLoRA is LoRA on a 4-bit base: one or the other"),
    # the reward model trains at the iterations ref_reset_steps marks, which these runs cannot have
    Refusal(("lora", "reward_model_training"), "ref_reset_steps", PEFT_RESET),
    Refusal(("qlora", "reward_model_training"), "ref_reset_steps", PEFT_RESET),
    Refusal(("reward_model_training", "teacher"), "ref_reset_steps", TEACHER_RESET),
)


def refusal_of(a: str, b: str) -> Refusal | None:
    """The table's refusal of the pair (either order), or None: the pair runs."""
    return next((r for r in REFUSALS if set(r.pair) == {a, b}), None)


def pairs() -> list[tuple[str, str]]:
    """Every pair of features, in the table's order."""
    return list(combinations([f.name for f in FEATURES], 2))


def refused(c, processes: int) -> Refusal | None:
    """The first refusal of the table whose two features are on in config ``c`` on ``processes``
    processes (and whose condition holds), else None."""
    for r in REFUSALS:
        a, b = (BY_NAME[x] for x in r.pair)
        if a.on(c, processes) and b.on(c, processes) and (r.when is None or r.when(c)):
            return r
    return None


def composition_page() -> str:
    """docs/guides/composition.md: the matrix of every pair, written from the table."""
    names = [f.name for f in FEATURES]
    lines = ["# Features that compose", "",
             "Every pair of the features below runs together, or is refused before anything loads for the",
             "reason given. The table is written from `grpo/config/composition.py`, which validation reads, so it",
             "says what the code does; `tests/test_composition.py` meets every refusal and trains pairs that run.",
             "", "| feature | what |", "|---|---|"]
    lines += [f"| `{f.name}` | {f.doc} |" for f in FEATURES]
    lines += ["", "| | " + " | ".join(f"`{n}`" for n in names) + " |", "|---" * (len(names) + 1) + "|"]
    for a in names:
        cells = []
        for b in names:
            r = None if a == b else refusal_of(a, b)
            cells.append("" if a == b else "runs" if r is None else f"refused{' if ' + r.when_doc if r.when else ''}")
        lines.append(f"| `{a}` | " + " | ".join(cells) + " |")
    lines += ["", "## Why a pair is refused", ""]
    lines += [f"- `{r.pair[0]}` with `{r.pair[1]}`{' (when ' + r.when_doc + ')' if r.when else ''}: "
              f"`{r.field}`: {r.reason}." for r in REFUSALS]
    return "\n".join(lines) + "\n"
