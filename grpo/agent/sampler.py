"""The agent sampler: a run's tools, environment factory and call format, turning samples into
multi-turn episodes through any rollout engine (the Collector and evaluation call it where a plain
run calls ``engine.generate``)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from grpo.agent.environments import (environment_reward, environment_tools, is_routed, load_factories,
                                     load_factory, new_environment, reset_environment)
from grpo.agent.episodes import Episode, episode_metrics, episodes_rollout, run_episodes
from grpo.agent.examples import NO_EXAMPLE, worked_example
from grpo.agent.formats import CallFormat, call_format, supports_tools
from grpo.agent.tools import Tool, check_unique, resolve_tools
from grpo.data.prompt_fit import fit_ids, system_head
from grpo.errors import DataError
from grpo.rollout.types import Rollout
from grpo.rollout.engine import RolloutEngine, SamplingSettings


def _with_observation(messages: list[dict], text: str | None) -> list[dict]:
    """TRL's rule: the text ``reset`` returned is appended to the last user message."""
    if not text:
        return messages
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return messages[:i] + [{**messages[i], "content": str(messages[i]["content"]) + text}] + messages[i + 1:]
    return messages + [{"role": "user", "content": text}]


@dataclass(frozen=True)
class AgentSettings:
    """A run's multi-turn settings; each field is the Config field named in its comment."""

    tools: str  # tools: comma-separated builtin:NAME or module:function references ('': none)
    environment_factory: str  # environment_factory: module:Class (TRL's form), or value=module:Class,... ('': none)
    tool_format: str  # tool_format: auto, hermes or python (agent.formats.CALL_FORMATS)
    max_turns: int  # max_turns: model turns of an episode
    tool_timeout: float  # tool_timeout: seconds per tool call (0: none)
    example_call: str  # tool_example_call ('': from the first tool's schema; 'none': no worked exchange)
    example_question: str  # tool_example_question
    environment_column: str = "task"  # environment_column: the column a dict environment_factory routes by
    program: str = ""  # agent: module:function, an agent program on the OpenAI API ('': none)
    program_timeout: float = 300.0  # agent_timeout: seconds an episode's program may take

    @property
    def enabled(self) -> bool:
        """Whether rollouts are episodes: tools, an environment or an agent program are named."""
        return bool(self.tools.strip() or self.environment_factory.strip() or self.program.strip())


class AgentSampler:
    """Samples episodes: ``tools`` (Tools shared by every episode), ``factory`` (an environment class
    or callable, a fresh instance per episode), ``fmt`` the call format, ``max_turns`` model turns,
    ``tool_timeout`` seconds per call; ``example_call`` / ``example_question``: the worked exchange
    shown where a row has no ``tool_example`` (``examples.worked_example``; the config's default
    builds one from the tools' schema, NO_EXAMPLE shows none). ``routes``: a row's ``column`` value ->
    (tools, factory) used for that row instead of ``tools`` and ``factory`` (TRL's dict
    ``environment_factory``, a mixture's sources); a row whose value has no route takes ``tools`` and
    ``factory``, or, when ``strict``, is an error naming its value."""

    def __init__(self, tokenizer, *, tools: list[Tool], factory=None, fmt: CallFormat, max_turns: int,
                 tool_timeout: float, example_call: str = NO_EXAMPLE, example_question: str = "",
                 routes: dict | None = None, column: str = "task", strict: bool = False):
        self.tok, self.tools, self.factory, self.fmt = tokenizer, tools, factory, fmt
        self.routes, self.column, self.strict = dict(routes or {}), column, strict
        self.max_turns, self.tool_timeout = max_turns, tool_timeout
        self.example_call, self.example_question = example_call, example_question
        self._examples: dict[tuple, dict | None] = {}  # the run-level worked exchange of each set of tools
        if tools and factory is None:  # a bad tool_example_call is an error before the model samples
            self.run_example(tools)
        self.last_metrics: dict = {}

    @classmethod
    def from_settings(cls, settings: AgentSettings, tokenizer):
        """The sampler ``settings`` ask for, its tools and environment class imported (an agent program's
        ProgramSampler where ``program`` is named); None when they name none of them."""
        s = settings
        if not s.enabled:
            return None
        if s.program.strip():
            from grpo.agent.programs import ProgramSampler, load_program

            return ProgramSampler(tokenizer, load_program(s.program), max_turns=s.max_turns, timeout=s.program_timeout)
        spec, tools = s.environment_factory.strip(), resolve_tools(s.tools)
        routes = {k: (tools, f) for k, f in load_factories(spec).items()} if is_routed(spec) else None
        factory = load_factory(spec) if spec and routes is None else None
        return cls(tokenizer, tools=tools, factory=factory, fmt=call_format(s.tool_format, tokenizer),
                   max_turns=s.max_turns, tool_timeout=s.tool_timeout, example_call=s.example_call,
                   example_question=s.example_question, routes=routes, column=s.environment_column,
                   strict=routes is not None)

    def close(self) -> None:
        """Nothing to release (an agent program's sampler stops its endpoint)."""

    def route(self, sample: dict) -> tuple[list[Tool], object]:
        """The tools and environment factory of ``sample`` (its ``column`` value's route)."""
        if not self.routes:
            return self.tools, self.factory
        value = sample.get(self.column)
        if value in self.routes:
            return self.routes[value]
        if self.strict:
            raise DataError(f"environment_factory: a row's {self.column!r} is {value!r}, which has no environment; "
                            f"routed values: {sorted(self.routes)}")
        return self.tools, self.factory

    def run_example(self, tools: list[Tool]) -> dict | None:
        """The worked exchange shown where a row has no ``tool_example`` (``examples.worked_example``)."""
        key = tuple(t.name for t in tools)
        if key not in self._examples:
            self._examples[key] = worked_example(tools, call=self.example_call, question=self.example_question)
        return self._examples[key]

    def start_messages(self, sample: dict, tools: list[Tool], system_prompt: str, observation: str | None) -> list[dict]:
        """The conversation an episode starts from: the system message (the system prompt and, where
        the template does not render tools, the format's description of them), a worked exchange (the
        sample's ``tool_example``, else the run's: ``run_example``), the prompt (with the environment's
        reset text)."""
        prompt = sample["prompt"]
        messages = list(prompt) if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
        system = [m["content"] for m in messages if m.get("role") == "system"]
        messages = [m for m in messages if m.get("role") != "system"]
        parts = system or ([system_prompt] if system_prompt else [])
        if tools and not (self.fmt.native and self._template_renders_tools()):
            parts.append(self.fmt.describe(tools))
        example = sample.get("tool_example") or self.run_example(tools)
        example = self.fmt.example_messages(example) if example else []
        head = [{"role": "system", "content": "\n\n".join(parts)}] if parts else []
        return head + example + _with_observation(messages, observation)

    def _template_renders_tools(self) -> bool:
        return supports_tools(self.tok)

    def _template_kw(self, tools: list[Tool]) -> dict:
        """The tools as the chat template takes them, where it renders them (the native formats)."""
        return {"tools": [t.schema for t in tools]} if tools and self.fmt.native and self._template_renders_tools() else {}

    def _render(self, messages: list[dict], tools: list[Tool]) -> str:
        if not getattr(self.tok, "chat_template", None):
            return "\n".join(str(m["content"]) for m in messages) + "\n"
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                            **self._template_kw(tools))

    def start_lengths(self, sample: dict, system_prompt: str) -> tuple[int, int]:
        """The token counts of ``sample``'s episode start, its system head (grpo.data.prompt_fit) and
        the whole, with its shared tools (an environment's own are not rendered: none is made here)."""
        tools, _ = self.route(sample)
        messages = self.start_messages(sample, tools, system_prompt, None)
        ids = self.tok(self._render(messages, tools), add_special_tokens=False)["input_ids"]
        return system_head(self.tok, messages, ids, **self._template_kw(tools)), len(ids)

    def start_ids(self, sample: dict, tools: list[Tool], system_prompt: str, observation: str | None,
                  max_prompt_length: int) -> tuple[list[dict], list[int], int]:
        """An episode's start: its messages, their token ids fitted to ``max_prompt_length`` (cut from
        the middle, the system message and the tools it holds kept: grpo.data.prompt_fit), and the
        ids' length before the cut."""
        messages = self.start_messages(sample, tools, system_prompt, observation)
        ids = self.tok(self._render(messages, tools), add_special_tokens=False)["input_ids"]
        head = system_head(self.tok, messages, ids, **self._template_kw(tools)) if len(ids) > max_prompt_length else 0
        return messages, fit_ids(ids, head, max_prompt_length), len(ids)

    def episodes(self, samples: list[dict], *, group_size: int, system_prompt: str, max_prompt_length: int,
                 keys: list[int] | None) -> tuple[list[Episode], int]:
        """G fresh episodes per sample (an environment instance each), and how many of their start
        contexts were cut to ``max_prompt_length`` (``start_ids``)."""
        out, cut = [], 0
        for i, sample in enumerate(samples):
            shared, factory = self.route(sample)
            for j in range(group_size):
                env = new_environment(factory) if factory is not None else None
                observation = reset_environment(env, sample) if env is not None else None
                tools = shared + (environment_tools(env) if env is not None else [])
                check_unique(tools, "tools + environment_factory")
                messages, ids, n = self.start_ids(sample, tools, system_prompt, observation, max_prompt_length)
                cut += n > max_prompt_length and j == 0
                out.append(Episode(prompt=ids, tools={t.name: t for t in tools},
                                   messages=messages, env=env,
                                   key=None if keys is None else keys[i * group_size + j]))
        return out, cut

    def generate(self, engine: RolloutEngine, samples: list[dict], *, group_size: int, sampling: SamplingSettings,
                 system_prompt: str = "", keys: list[int] | None = None, with_logprobs: bool = False,
                 greedy: bool = False) -> Rollout:
        """``group_size`` episodes per sample, grouped by sample, as one Rollout (``episodes_rollout``);
        ``sampling.max_new_tokens`` is each episode's token budget. The step's tool metrics are kept
        in ``last_metrics``."""
        start = time.perf_counter()
        eps, cut = self.episodes(samples, group_size=group_size, system_prompt=system_prompt,
                                 max_prompt_length=sampling.max_prompt_length, keys=keys)
        run_episodes(engine, eps, fmt=self.fmt, sampling=sampling, max_turns=self.max_turns,
                     tool_timeout=self.tool_timeout, with_logprobs=with_logprobs, greedy=greedy, group_size=group_size)
        ro = episodes_rollout(eps, pad_id=self.tok.pad_token_id, with_logprobs=with_logprobs, engine=engine.name,
                              seconds=time.perf_counter() - start, prompts_truncated=cut,
                              device=next(engine.model.parameters()).device)
        for ep, info in zip(eps, ro.episodes):
            if ep.env is not None:
                info["environment_reward"] = environment_reward(ep.env)
        self.last_metrics = episode_metrics(ro.episodes)
        return ro
