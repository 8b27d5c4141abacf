"""Multi-turn rollouts with tools and environments: tools (typed functions, ``BUILTIN_TOOLS``), call
formats (``CALL_FORMATS``), TRL-form environments, concurrent tool execution, the episode runner and
the sampler the trainer and evaluation use. Sits above rollout and rewards, below config and train."""

from grpo.agent.calculator import calc, evaluate_arithmetic
from grpo.agent.episodes import Episode, episode_counts, episode_metrics, episodes_rollout, run_episodes, turn_key
from grpo.agent.formats import CALL_FORMATS, DEFAULT_FORMAT, Call, CallFormat, call_format, supports_tools
from grpo.agent.sampler import AgentSampler, AgentSettings
from grpo.agent.tools import BUILTIN_TOOLS, Tool, make_tool, resolve_tool, resolve_tools

__all__ = ["BUILTIN_TOOLS", "CALL_FORMATS", "DEFAULT_FORMAT", "AgentSampler", "AgentSettings", "Call", "CallFormat", "Episode", "Tool",
           "calc", "call_format", "episode_counts", "episode_metrics", "episodes_rollout", "evaluate_arithmetic", "make_tool",
           "resolve_tool", "resolve_tools", "run_episodes", "supports_tools", "turn_key"]
