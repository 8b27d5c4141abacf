"""Rewards: callables ``(completion: str, sample: dict) -> float | None``.

Built-ins are looked up by name in ``REWARDS``; anything else is a ``module:function`` path.
``score_completions`` runs a weighted list of them and turns every failure (an exception, None, NaN,
inf, a non-number) into a counted, logged event: the sample gets no reward and the run continues.
"""

from grpo.rewards.answers import extract_answer, parse_number
from grpo.rewards.builtin import REWARDS, format_reward, math_reward, numeric_reward, resolve_reward
from grpo.rewards.code import code_reward, code_strict_reward
from grpo.rewards.scoring import RewardResult, score_completions

__all__ = ["REWARDS", "RewardResult", "code_reward", "code_strict_reward", "extract_answer", "format_reward", "math_reward", "numeric_reward",
           "parse_number", "resolve_reward", "score_completions"]
