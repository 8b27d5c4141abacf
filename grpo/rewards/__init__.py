"""Rewards: callables ``(completion: str, sample: dict) -> float | None``, or TRL's batch form
``(prompts, completions, completion_ids, **columns) -> list[float | None]`` (``forms``), each held
as a ``Reward`` that declares its form and capabilities (``reward``).

Built-ins are ``Reward`` entries of the registry ``REWARDS``; anything else is a ``module:function``
path or a URL.
``score_completions`` runs a weighted list of them: None is "not applicable to this row" (left out of
its weighted sum), and every failure (an exception, NaN, inf) is a counted, logged event: the sample
gets no reward and the run continues. A value of the wrong type or shape stops the run (the reward's bug).
"""

from grpo.rewards.answers import extract_answer, parse_number
from grpo.rewards.builtin import REWARDS, format_reward, math_reward, numeric_reward, resolve_reward
from grpo.rewards.code_rewards import code_reward, code_strict_reward
from grpo.rewards.reward import Reward, RewardOptions
from grpo.rewards.scoring import RewardResult, score_completions

__all__ = ["REWARDS", "Reward", "RewardOptions", "RewardResult", "code_reward", "code_strict_reward", "extract_answer", "format_reward", "math_reward", "numeric_reward",
           "parse_number", "resolve_reward", "score_completions"]
