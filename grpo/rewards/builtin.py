"""Built-in rewards (``REWARDS``, each a ``Reward`` that declares its capabilities) and the lookup of
a reward by name, ``module:function`` path or URL."""

from __future__ import annotations

import importlib
import math
import re
from dataclasses import replace
from typing import Callable

from grpo.errors import ConfigError
from grpo.registry import Registry
from grpo.rewards.answers import all_boxed, parse_number
from grpo.rewards.code import program_parses
from grpo.rewards.code_rewards import check_code_sandbox, code_batch_reward, code_strict_batch_reward
from grpo.rewards.code_style import code_style_reward
from grpo.rewards.completeness import incompleteness
from grpo.rewards.forms import is_batch_reward
from grpo.rewards.generated_tests import code_generated_batch_reward
from grpo.rewards.judge import JudgeReward, no_judge
from grpo.rewards.mathverify import candidates, gold_answer, math_reward, normalize_number_text
from grpo.rewards.remote import AsyncReward, HttpReward, is_async, is_url
from grpo.rewards.reward import Reward, RewardOptions
from grpo.rewards.reward_model import RewardModelReward, no_reward_model

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


# the last number of the text stated as a result: after '=', 'is', 'equals' or ':' with no digit after it
_STATED = re.compile(r"(?:=|\bis\b|\bequals\b|:)\s*\$?\s*-?\d[\d,]*(?:\.\d+)?[^\d]*$", re.IGNORECASE)
_BARE = re.compile(r"-?\d[\d,]*(?:\.\d+)?\.?")  # the answer is the number alone


STATED_BONUS = 0.1  # a tenth of a right answer: stating a result never outweighs getting it right


def stated_answer_reward(completion: str, sample: dict) -> float:
    """0.1 when the completion states one final answer, right or wrong: a recognised form (\\boxed{},
    '#### n', 'answer is n'), or its last number stated as a result ('7 + 5 = 12', 'the sum is 12') or
    alone ('12'), not hedged ('12 or 13'); 0.0 for '8 + 1 = 1 + 2', which states no result. A format
    reward beside an accuracy reward of 1.0, as DeepSeek-R1 pairs them (arXiv:2501.12948, section
    2.2.2); ``reward_weights`` rescale it. ``grpo serve``'s ``final_answer`` completeness check applies
    the same rule."""
    text = completion.strip()
    if candidates(text, "0") is None:
        return 0.0
    stated = format_reward(text, sample) > 0 or bool(_STATED.search(text)) or bool(_BARE.fullmatch(text))
    return STATED_BONUS if stated else 0.0


def length_reward(completion: str, sample: dict) -> float:
    """Brevity: 1.0 for an empty completion falling linearly to 0.0 at 400 characters."""
    return max(0.0, 1.0 - len(completion) / 400)


def incompleteness_reward(completion: str, sample: dict) -> float:
    """Step-completeness shaping (English/ASCII checks): the share of four checks the completion fails,
    0.0 when complete (grpo.rewards.completeness). Used with a negative weight lambda, e.g.
    lambda = 0.3: rewards=numeric,incompleteness reward_weights=1,-0.3."""
    return incompleteness(completion, language="en")


def incompleteness_zh_reward(completion: str, sample: dict) -> float:
    """Step-completeness shaping with Chinese step markers (第一步, 第二步, 因此, 综上, paired
    formula delimiters): the share of five checks failed (grpo.rewards.completeness)."""
    return incompleteness(completion, language="zh")


def agent_reward(completion: str, sample: dict) -> float | None:
    """The reward an agent program (``agent=module:function``) returned for the episode (grpo.agent.programs
    puts it in the sample as "agent_reward"); None (a counted failure) when it returned none or failed."""
    value = sample.get("agent_reward")
    return None if value is None else float(value)


def environment_reward(completion: str, sample: dict) -> float | None:
    """The episode's environment score: ``get_reward()`` of the environment_factory instance it ran
    in (grpo.agent puts it in the sample as "environment_reward"); None (a counted failure) without one."""
    value = sample.get("environment_reward")
    return None if value is None else float(value)


def _code_reward(name: str, fn: Callable) -> Reward:
    """A sandboxed code reward: batch form (a step's programs graded concurrently), its sandbox checked
    at resolve time, unparsable programs sampled again (``resample_invalid_rounds``)."""
    return Reward(name, fn, batch=True, valid=program_parses, startup_check=check_code_sandbox)


REWARDS: Registry[Reward] = Registry("reward", field="rewards")
REWARDS.register(Reward("numeric", numeric_reward, reads_final_answer=True))
# its worker pool kills a call at its deadline: no second pool needed
REWARDS.register(Reward("math", math_reward, own_deadline=True, reads_final_answer=True))
REWARDS.register(Reward("format", format_reward, reads_final_answer=True))
REWARDS.register(Reward("stated_answer", stated_answer_reward, reads_final_answer=True))
REWARDS.register(Reward("length", length_reward))
REWARDS.register(Reward("incompleteness", incompleteness_reward))
REWARDS.register(Reward("incompleteness_zh", incompleteness_zh_reward))
REWARDS.register(_code_reward("code", code_batch_reward))
REWARDS.register(_code_reward("code_strict", code_strict_batch_reward))
REWARDS.register(_code_reward("code_generated", code_generated_batch_reward))  # + 10 tests per problem from its reference
REWARDS.register(Reward("code_style", code_style_reward))  # type hints, docstrings, exception handling; never run
REWARDS.register(Reward("reward_model", no_reward_model, batch=True, doc=RewardModelReward.__doc__,
                        build=lambda o: RewardModelReward(o.reward_model, transform=o.reward_model_transform)))
REWARDS.register(Reward("agent", agent_reward))  # an agent program's returned reward
REWARDS.register(Reward("environment", environment_reward))  # an environment_factory episode's get_reward()
# a chat model behind an OpenAI-compatible API; HttpReward's deadline, retries and timeout count
REWARDS.register(Reward("judge", no_judge, batch=True, own_deadline=True, doc=JudgeReward.__doc__,
                        build=lambda o: JudgeReward(o.judge, timeout=o.timeout, retries=o.retries,
                                                    concurrency=o.concurrency)))


def resolve_named(name: str, registry: Registry) -> Callable:
    """The entry ``registry[name]``, or the callable at ``package.module:function``; errors name the
    registry's config field and list its entries (used for rewards and step rewards alike)."""
    if name in registry:
        return registry[name]
    if ":" not in name:
        raise registry.unknown(name, hint=", or a module:function path")
    module, func = name.split(":", 1)
    try:
        fn = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{registry.field}: cannot load {name!r}: {e}") from None
    if not callable(fn):
        raise ConfigError(f"{registry.field}: {name!r} is not callable")
    return fn


def user_reward(name: str, fn: Callable, options: RewardOptions) -> Reward:
    """A user's callable as a Reward, made once: an ``async def`` per-completion function becomes an
    AsyncReward (its batch's calls concurrent, each within ``options.timeout``); any other keeps its
    form, told by its signature."""
    if is_async(fn) and not is_batch_reward(fn):
        return Reward(name, AsyncReward(fn, timeout=options.timeout, concurrency=options.concurrency), batch=True,
                      own_deadline=True)
    return Reward.of(name, fn)


def resolve_reward(name: str, options: RewardOptions | None = None) -> Reward:
    """A built-in by name, ``package.module:function``, or an http(s):// URL (an HttpReward), as a
    Reward; errors list the built-ins. ``options``: the deadline of the rewards that keep their own
    (an ``async def`` one, awaited in the trainer's process, and a URL's requests, with their retries),
    the most async calls in flight, and the reward model's settings. A built-in that declares a
    ``startup_check`` (the sandboxed code rewards) runs it here, so a run that cannot grade stops
    before its model loads."""
    options = options or RewardOptions()
    if is_url(name):
        return Reward(name, HttpReward(name, timeout=options.timeout, retries=options.retries), batch=True,
                      own_deadline=True)
    if name not in REWARDS:
        return user_reward(name, resolve_named(name, REWARDS), options)
    reward = REWARDS[name]
    if reward.build is not None:
        reward = replace(reward, fn=reward.build(options), build=None)
    if reward.startup_check is not None:
        reward.startup_check()
    return reward
