"""verifiers environments (prime-rl's Environments Hub; verifiers 0.4, its v1 API) trained with grpo's loop:
``task=verifiers:<environment id>``.

The environment's taskset is the dataset (its prompts as chat messages, system prompt first; its answers),
its own ``run(task, agents)`` is the multi-turn protocol, and its task's rewards (the weighted
``@vf.reward`` methods) are the reward: each episode runs as an agent program (grpo.agent.programs) whose
every model call goes through the recording endpoint, so the whole conversation trains as one sample, and
whose return value is the environment's reward (the built-in reward ``agent``).

verifiers runs an agent through a harness program (started with ``uv``) behind an HTTP proxy; here the
environment's agents are in-process stand-ins with the surface an ``Env.run`` uses (``run``,
``interaction`` -> ``turn``, ``trainable``, ``config``), whose model is the policy. They follow verifiers'
tool-less ``null`` harness (the system prompt as its own message, a prompted task speaking first,
``max_turns`` and trace-level ``@vf.stop`` hooks checked before each call) and score the trace with
``Task.score`` as verifiers closes a rollout. What needs the harness or a runtime (tool servers, tasks that
override ``setup`` / ``finalize``, rewards that take a runtime, LLM judges, ``@vf.intercept``, request- or
response-level stops, a seat pinned to another harness) is refused when the episode starts, naming it.
Checked against verifiers' own loop on a single-turn and a multi-turn environment: the same messages,
rewards and stop conditions. This module imports verifiers; grpo imports it only for a verifiers task.
"""

from __future__ import annotations

import asyncio
import inspect
import typing
from collections.abc import Callable, Mapping
from contextlib import asynccontextmanager

import verifiers.v1 as vf
from verifiers.v1.state import state_cls  # not re-exported by verifiers.v1

from grpo.data.verifiers_tasks import env_id_of, load_verifiers_env, message_list, to_wire
from grpo.errors import ConfigError, DataError

Sample = Callable[[list[dict]], str]
Samplers = Sample | Mapping[str, Sample]



class Unsupported(ConfigError):
    """The task/env needs verifiers machinery this in-process adapter does not provide."""


# ----------------------------------------------------------------------------- helpers


def _is_overridden(task: vf.Task, name: str) -> bool:
    return getattr(type(task), name) is not getattr(vf.Task, name)


def _needs_runtime(fn: Callable) -> bool:
    p = inspect.signature(fn).parameters.get("runtime")
    return p is not None and p.default is inspect.Parameter.empty


def _check_supported(task: vf.Task) -> list[Callable]:
    """Raise `Unsupported` for anything that needs the harness/runtime/network path;
    returns the task's Trace-boundary @stop hooks."""
    why = []
    if type(task).toolsets(task.config):
        why.append("task toolsets (MCP tool servers)")
    for hook in ("setup", "finalize", "stage_verifier"):
        if _is_overridden(task, hook):
            why.append(f"Task.{hook} override (takes a runtime)")
    for kind in ("reward", "metric"):
        why += [f"@vf.{kind} {fn.__name__} requires runtime" for fn in task.hooks(kind) if _needs_runtime(fn)]
    if task.config.judges:
        why.append("plugged judges (LLM calls)")
    # `vf.intercept` marks functions with an `intercept` attribute (verifiers.v1.utils.decorators.mark)
    if any(callable(f) and hasattr(f, "intercept") for k in type(task).__mro__ for f in vars(k).values()):
        why.append("@vf.intercept hooks")
    stops = []
    for fn in task.hooks("stop"):
        hints = typing.get_type_hints(fn)
        if any(hints.get(n) in (vf.Request, vf.Response) for n in inspect.signature(fn).parameters):
            why.append(f"@vf.stop {fn.__name__} on Request/Response")
        else:
            stops.append(fn)
    if why:
        raise Unsupported(f"{type(task).__name__}: " + "; ".join(why))
    return stops


async def _call(fn: Callable, *args):
    out = fn(*args)
    return await out if inspect.isawaitable(out) else out


# ----------------------------------------------------------------------------- rollout


class _LocalRollout:
    """One agent rollout on one task: the trace, turns, limits/stops, close+score."""

    def __init__(self, task: vf.Task, spec: vf.AgentConfig, sample: Sample, *, name: str = "agent",
                 trainable: bool = True, has_user: bool = False):
        self.task, self.spec, self.sample = task, spec, sample
        self.stops = _check_supported(task)
        if task.data.prompt is None and not has_user:
            raise vf.TaskError("task has no prompt and no user to open the conversation")
        self.trace = vf.Trace(
            task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            state=state_cls(type(task))(),
            agent=vf.AgentInfo(config=spec, name=name, trainable=trainable),
        )
        self.failed = False
        self.closed = False

    @property
    def ok(self) -> bool:
        return not self.failed and self.trace.stop_condition is None

    async def refused(self) -> str | None:
        """= RolloutSession.refused(): limits, then Trace-boundary @stops, before each call."""
        mt = self.spec.max_turns
        if mt is not None and self.trace.num_turns >= mt:
            return "max_turns"
        for stop in self.stops:
            result = await _call(stop, self.trace)
            if not isinstance(result, bool):
                raise vf.TaskError(f"@stop must return bool, got {type(result).__name__}")
            if result:
                return stop.__name__
        return None

    async def step(self, messages: list[vf.Message] | None) -> vf.Segment | None:
        """One segment of the null harness without tools = one model call. Returns the
        segment, or None when the call was refused (no nodes committed, like the real
        interception's 400)."""
        if self.closed or not self.ok:
            return None
        try:
            if (why := await self.refused()) is not None:
                self.trace.stop(why)
                return None
            if self.trace.nodes:  # resume: the current branch + the user's new messages
                request = [*self.trace.messages, *(messages or [])]
            else:  # first segment: system prompt, then the task prompt or the user's opener
                data = self.task.data
                opener = message_list(data.prompt) if messages is None else list(messages)
                request = ([vf.SystemMessage(content=data.system_prompt)] if data.system_prompt else []) + opener
            reply = await _call(self.sample, [to_wire(m) for m in request])
            assistant = reply if isinstance(reply, vf.AssistantMessage) else vf.AssistantMessage(content=str(reply))
        except Exception as e:  # like Rollout.step: a failure is data on the trace
            self.fail(e)
            return None
        nodes = self.trace.nodes
        parent = len(nodes) - 1 if nodes else None
        for m in request[len(self.trace.messages) if nodes else 0:]:
            nodes.append(vf.MessageNode(parent=parent, message=m))
            parent = len(nodes) - 1
        nodes.append(vf.MessageNode(parent=parent, message=assistant, sampled=True))
        return vf.Segment(messages=[assistant])

    def fail(self, error: Exception) -> None:
        self.failed = True
        self.trace.record_error(error)

    async def close(self, condition: str) -> vf.Trace:
        """= Rollout.close() minus runtime/harness: stop condition, then task scoring
        (skipped for a failed run; a stopped run scores its partial trajectory)."""
        if self.closed:
            return self.trace
        self.closed = True
        trace = self.trace
        if self.ok:
            trace.stop(condition)
        if not self.failed:
            timeout = self.spec.timeout.scoring or self.task.data.timeout.scoring
            try:
                async with asyncio.timeout(timeout):
                    await self.task.score(trace)  # runtime=None: offline scoring
            except TimeoutError:
                trace.record_timeout("scoring")
            except Exception as e:
                self.fail(e)
        trace.is_completed = True
        trace.ok = not self.failed
        return trace


# ----------------------------------------------------------------------------- agents


class LocalInteraction:
    """Duck-type of `vf.Interaction` (turn / trace / close)."""

    def __init__(self, rollout: _LocalRollout):
        self._run = rollout
        self._started = False
        self._over = False
        self._lock = asyncio.Lock()

    @property
    def trace(self) -> vf.Trace:
        return self._run.trace

    async def turn(self, message: str | list | None = None) -> vf.Segment:
        async with self._lock:
            if self._run.closed:
                raise RuntimeError("this interaction is closed")
            if self._over:
                raise RuntimeError("the exchange is over (the run ended); read interaction.trace")
            prompted = not self._started and self.trace.task.data.prompt is not None
            if message is None and not prompted:
                raise ValueError("a bare turn() takes a prompted task's opening reply only")
            if message is not None and prompted:
                raise ValueError("the task's prompt opens this exchange: take its first reply with a bare turn()")
            self._started = True
            seg = await self._run.step(None if message is None else message_list(message))
            if seg is None:
                self._over = True
                return vf.Segment(messages=[], terminated=True)
            return seg

    async def send(self, *a, **k):
        raise Unsupported("Interaction.send")

    steer = send


class LocalAgent:
    """What an ``Env`` sees of a ``vf.Agent`` through ``agents.<seat>``: ``run``, ``interaction``,
    ``trainable`` and ``config`` (the seat's AgentConfig), with the policy as its model."""

    def __init__(self, name: str, spec: vf.AgentConfig, sample: Sample, completed: list[vf.Trace]):
        self.name, self.spec, self.sample = name, spec, sample
        self.trainable = True  # Env.setup may set False (e.g. a simulated user)
        self._completed = completed

    @property
    def config(self) -> vf.AgentConfig:  # verifiers' name for the seat's settings
        return self.spec

    def _rollout(self, task, has_user=False, **borrowed) -> _LocalRollout:
        if any(v not in (None, False) for v in borrowed.values()):
            raise Unsupported(f"agent.run/interaction with {sorted(k for k, v in borrowed.items() if v)}")
        return _LocalRollout(task, self.spec, self.sample, name=self.name, trainable=self.trainable,
                             has_user=has_user)

    async def run(self, task: vf.Task, *, runtime=None, tools=None, on_trace=None,
                  collect_artifacts: bool = False) -> vf.Trace:
        """= Agent.run: one segment on the task's prompt, 'agent_completed', scored."""
        r = self._rollout(task, runtime=runtime, tools=tools, collect_artifacts=collect_artifacts)
        if on_trace:
            on_trace(r.trace)
        await r.step(None)
        trace = await r.close("agent_completed")
        self._completed.append(trace)
        return trace

    @asynccontextmanager
    async def interaction(self, task: vf.Task, *, runtime=None, tools=None, on_trace=None):
        """= Agent.interaction: the caller is the user; leaving closes as 'user_closed'
        and scores."""
        r = self._rollout(task, has_user=True, runtime=runtime, tools=tools)
        if on_trace:
            on_trace(r.trace)
        try:
            yield LocalInteraction(r)
        except Exception as e:
            r.fail(e)
            raise
        finally:
            self._completed.append(await r.close("user_closed"))

    def provision(self, task=None):
        raise Unsupported("agent.provision (runtime boxes)")


# ----------------------------------------------------------------------------- public API


async def run_episode(env: vf.Env, task: vf.Task, sample: Samplers) -> vf.Episode:
    """= Env.run_episode with LocalAgents: setup(agents) -> run(task, agents) ->
    finalize(task, episode). `sample` is one callable for every seat or {seat: callable}."""
    episode = vf.Episode(env=vf.EnvInfo(id=env.config.env_id),
                         task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash))
    completed = episode.traces  # (pydantic copies lists passed in; append to the model's own)

    def make(name: str, spec: vf.AgentConfig) -> LocalAgent:
        fn = sample.get(name) if isinstance(sample, Mapping) else sample
        if fn is None:
            raise KeyError(f"no sampler for seat {name!r}")
        if spec.harness is not None and spec.harness.id != "null":
            raise Unsupported(f"seat {name!r} pins harness {spec.harness.id!r}; only null-harness semantics")
        return LocalAgent(name, spec, fn, completed)

    agents = vf.Agents(env.config, make)
    async with asyncio.timeout(env.config.timeout.episode):
        await env.setup(agents)
        await env.run(task, agents)
    if not completed:
        raise RuntimeError(f"{type(env).__name__}.run() ran no agent")
    async with asyncio.timeout(env.config.timeout.finalize):
        await env.finalize(task, episode)
    episode.ok = all(t.ok for t in episode.traces)
    return episode


class VerifiersProgram:
    """The agent program of ``task=verifiers:<id>``: one episode of the environment's own ``run`` per call,
    every model turn a call on the client; returns the trainable seat's reward (None when it failed)."""

    def __init__(self, spec: str):
        self.env = load_verifiers_env(env_id_of(spec))
        self.tasks = {task.key: task for task in self.env.taskset}
        for task in self.tasks.values():  # what only verifiers' harness can run is refused before training
            _check_supported(task)
        seats = [name for name, value in self.env.config if isinstance(value, vf.AgentConfig)]
        if len(seats) != 1:  # every seat would call the one recording client: their turns would interleave
            raise Unsupported(f"{self.env.config.env_id}: {len(seats)} agent seats ({', '.join(seats) or 'none'}); "
                              "grpo trains environments with one agent seat (no simulated user or second agent)")

    def __call__(self, client, row: dict) -> float | None:
        task = self.tasks.get(row.get("verifiers_key"))
        if task is None:
            raise DataError(f"a row's verifiers_key {row.get('verifiers_key')!r} names no task of "
                            f"{self.env.config.env_id}")

        def sample(messages: list[dict]) -> str:
            reply = client.chat.completions.create(model="policy", messages=messages)
            return reply.choices[0].message.content or ""

        episode = asyncio.run(run_episode(self.env, task, sample))
        trainable = [t for t in episode.traces if t.agent.trainable]
        if len(trainable) != 1 or not trainable[0].ok:
            return None
        return float(trainable[0].reward)
