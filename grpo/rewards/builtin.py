"""Built-in rewards and the lookup of a reward by name or ``module:function`` path."""

from __future__ import annotations

import importlib
import math
import re
from typing import Callable

from grpo.errors import ConfigError
from grpo.rewards.answers import all_boxed, parse_number
from grpo.rewards.code import code_batch_reward, code_strict_batch_reward
from grpo.rewards.code_style import code_style_reward
from grpo.rewards.completeness import incompleteness
from grpo.rewards.forms import is_batch_reward
from grpo.rewards.generated_tests import code_generated_batch_reward
from grpo.rewards.judge import JudgeReward, JudgeSettings
from grpo.rewards.mathverify import candidates, gold_answer, math_reward, normalize_number_text
from grpo.rewards.remote import DEFAULT_CONCURRENCY, AsyncReward, HttpReward, is_async, is_url
from grpo.rewards.reward_model import reward_model_reward

RewardFn = Callable[..., "float | None | list"]  # either form (grpo.rewards.forms)


def numeric_reward(completion: str, sample: dict) -> float:
    """1.0 when the final answer equals sample['answer'] (GSM8K: the number after '####') as a plain
    number: every \\boxed{} (all must agree), else the last number; hedges score 0 by the same rules as
    ``math_reward`` ('42 or 43', '41, 42, 43', several different boxes, an empty box)."""
    gold_text = gold_answer(str(sample["answer"]))
    gold = parse_number(normalize_number_text(gold_text))
    answers = candidates(completion, gold_text) if gold is not None else None
    if not answers:
        return 0.0
    values = [parse_number(a) for a in answers]
    return float(all(v is not None and math.isclose(v, gold, rel_tol=1e-9, abs_tol=1e-9) for v in values))


def format_reward(completion: str, sample: dict) -> float:
    """1.0 when the completion states one final answer in a recognised form: \\boxed{...},
    '#### n' or 'answer is n'."""
    if all_boxed(completion):
        return 1.0
    return float(bool(re.search(r"####\s*-?[\d,.]+|answer is:?\s*\$?-?[\d,.]+", completion, re.IGNORECASE)))


def length_reward(completion: str, sample: dict) -> float:
    """Brevity: 1.0 for an empty completion falling linearly to 0.0 at 400 characters."""
    return max(0.0, 1.0 - len(completion) / 400)


def incompleteness_reward(completion: str, sample: dict) -> float:
    """Step-completeness shaping (English/ASCII checks): the share of four checks the completion fails,
    0.0 when complete (grpo.rewards.completeness). Used with a negative weight lambda, e.g. the seed's
    lambda = 0.3 (seed 003 section 3.3): rewards=numeric,incompleteness reward_weights=1,-0.3."""
    return incompleteness(completion, language="en")


def incompleteness_zh_reward(completion: str, sample: dict) -> float:
    """Step-completeness shaping with the seed's Chinese markers (第一步, 第二步, 因此, 综上, paired
    formula delimiters): the share of five checks failed (grpo.rewards.completeness)."""
    return incompleteness(completion, language="zh")


def environment_reward(completion: str, sample: dict) -> float | None:
    """The episode's environment score: ``get_reward()`` of the environment_factory instance it ran
    in (grpo.agent puts it in the sample as "environment_reward"); None (a counted failure) without one."""
    value = sample.get("environment_reward")
    return None if value is None else float(value)


REWARDS: dict[str, RewardFn] = {
    "numeric": numeric_reward,
    "math": math_reward,
    "format": format_reward,
    "length": length_reward,
    "incompleteness": incompleteness_reward,
    "incompleteness_zh": incompleteness_zh_reward,
    "code": code_batch_reward,  # batch form: a step's programs are graded concurrently in the sandbox
    "code_strict": code_strict_batch_reward,
    "code_generated": code_generated_batch_reward,  # batch form: + 10 tests per problem from its reference
    "code_style": code_style_reward,  # type hints, docstrings, exception handling; parsed, never run
    "reward_model": reward_model_reward,  # batch form: fn(completions, samples) -> list[float]
    "environment": environment_reward,  # an environment_factory episode's get_reward()
}


def resolve_named(name: str, registry: dict, *, field: str):
    """``registry[name]``, or the callable at ``package.module:function``; errors name the config
    field and list the built-ins (used for rewards and step rewards alike)."""
    if name in registry:
        return registry[name]
    if ":" not in name:
        extra = ["judge"] if field == "rewards" else []  # built by resolve_reward from the judge_* settings
        raise ConfigError(f"{field}: unknown name {name!r}; built-ins: {sorted([*registry, *extra])}, "
                         f"or give a module:function path")
    module, func = name.split(":", 1)
    try:
        fn = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{field}: cannot load {name!r}: {e}") from None
    if not callable(fn):
        raise ConfigError(f"{field}: {name!r} is not callable")
    return fn


def resolve_reward(name: str, *, timeout: float = 0.0, retries: int = 0,
                   concurrency: int = DEFAULT_CONCURRENCY, options: dict | None = None) -> RewardFn:
    """A built-in by name, ``package.module:function``, or an http(s):// URL (an HttpReward); errors
    list the built-ins. An ``async def`` function becomes an AsyncReward (its batch's calls concurrent).
    ``timeout`` (seconds, 0 = none), ``retries`` and ``concurrency`` set those two's deadline per call
    or request, HTTP's retries and the most async calls in flight (an ``async def`` reward of TRL's batch
    form is awaited once per batch, in the trainer's process). A reward with a ``startup_check``
    attribute (the sandboxed code rewards) runs it here, so a run that cannot grade stops before its
    model loads. ``judge`` is a JudgeReward with the settings of ``options`` (the config's fields;
    its ``judge_*`` ones)."""
    if name == "judge":
        return JudgeReward(JudgeSettings.from_options(options or {}), timeout=timeout, retries=retries,
                           concurrency=concurrency)
    if is_url(name):
        return HttpReward(name, timeout=timeout, retries=retries)
    fn = resolve_named(name, REWARDS, field="rewards")
    if is_async(fn) and not is_batch_reward(fn):
        return AsyncReward(fn, timeout=timeout, concurrency=concurrency)
    check = getattr(fn, "startup_check", None) if name in REWARDS else None
    if check is not None:
        check()
    return fn
