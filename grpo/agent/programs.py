"""Agent programs (``agent=module:function``): an ordinary program written against the OpenAI API trains
as it is. ``function(client, row)`` receives an ``openai.OpenAI`` client and the dataset row, calls the
model as often as it likes, runs its own tools between the calls, and returns a reward (the built-in
reward ``agent`` reads it) or None (the run's rewards grade the last reply).

The client's base URL is grpo's own recording endpoint (loopback, a per-run key, the request limits of
every grpo server): each episode has a path of its own, ``/e/<token>/v1``. A call renders the messages
with the chat template, samples from the policy through the run's rollout engine (the calls of all
live episodes go to the engine as one batch) and records the call's token ids and log-probs. A call
whose messages extend the episode's last call (its messages, then the reply given) is tokenized as that
call's exact tokens plus the new messages' turn (never re-rendered, as in grpo.agent.episodes), so the
whole episode is one sample of its group: the model's replies trained, everything between them read
only. A call that starts over (messages that do not extend the last call) starts a new chain; only the
episode's last chain trains (``agent/restarted_chains`` counts the others).

Sampling keys: call k of a row draws from ``turn_key(key, k)``, so an episode's tokens depend on its key.
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
import time
from dataclasses import dataclass, field

from grpo.agent.episodes import Episode, episode_metrics, episodes_rollout, turn_key
from grpo.agent.tools import resolve_callable
from grpo.data.prompt_fit import fit_ids, system_head
from grpo.errors import ConfigError
from grpo.infra.http import GuardedServer, HttpError, HttpLimits, Route, parse_json
from grpo.rollout.engine import RolloutEngine, SamplingSettings
from grpo.rollout.types import Rollout, eos_token_ids

MARK = "\u2063GRPO-REPLY\u2063"  # stands for the last reply when the turn after it is rendered
WINDOW_S = 0.05  # a batch waits this long for more episodes' calls when not every live episode has called


def load_program(spec: str):
    """The function ``agent`` names (``module:function``), or a verifiers environment's episodes
    (``verifiers:<id>``, grpo.agent.verifiers_env)."""
    if spec.strip().startswith("verifiers:"):
        try:
            from grpo.agent.verifiers_env import VerifiersProgram
        except ImportError:
            raise ConfigError("agent: a verifiers environment needs the verifiers package (pip install -e '.[envs]')") \
                from None
        return VerifiersProgram(spec)
    fn = resolve_callable(spec.strip(), "agent")
    if not callable(fn):
        raise ConfigError(f"agent: {spec!r} is not callable")
    return fn


def _text(content) -> str:
    """A message's content as text (OpenAI's list of parts: their text joined)."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                                         for m in msgs):
        raise HttpError(400, "messages", "messages: a non-empty list of {role, content}")
    return [{"role": m["role"], "content": _text(m.get("content"))} for m in msgs]


@dataclass
class _Call:
    """One request waiting for the engine."""

    ep: "_Episode"
    context: list[int]
    room: int
    done: threading.Event = field(default_factory=threading.Event)
    reply: dict | None = None


@dataclass
class _Episode:
    row: dict
    key: int | None
    token: str
    prompt: list[int] = field(default_factory=list)  # the chain's first context
    ids: list[int] = field(default_factory=list)  # the chain's tokens after it: replies and the turns between
    trained: list[int] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    history: list[dict] = field(default_factory=list)  # the last call's messages and the reply given
    calls: list[dict] = field(default_factory=list)  # every call: its messages and reply (the log)
    chains: int = 0
    truncated: bool = False
    result: object = None
    error: str = ""
    finished: bool = False


class ProgramSampler:
    """Samples episodes by running ``fn`` once per (row, group member) in a thread of its own, against
    the recording endpoint (the module docstring). ``max_turns``: most calls per episode; ``timeout``:
    seconds an episode's program may take in all."""

    def __init__(self, tokenizer, fn, *, max_turns: int, timeout: float):
        self.tok, self.fn, self.max_turns, self.timeout = tokenizer, fn, max_turns, timeout
        self.routes: dict = {}  # as AgentSampler's: a program routes no row to tools of its own
        self.key = secrets.token_urlsafe(24)
        self._episodes: dict[str, _Episode] = {}
        self._pending: list[_Call] = []
        self._cv = threading.Condition()
        self._ctx: dict = {}
        self.last_metrics: dict = {}
        self.server: GuardedServer | None = None

    def _serve(self) -> str:
        """The endpoint's base URL, started on a free loopback port the first time (again after close)."""
        if self.server is None:
            self.server = GuardedServer(("127.0.0.1", 0), _Routes(self), api_key=self.key, limits=HttpLimits())
            threading.Thread(target=self.server.serve_forever, name="grpo-agent-endpoint", daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def start_lengths(self, sample: dict, system_prompt: str) -> tuple[int, int]:
        """Nothing to measure before the program runs: its first call's prompt is fitted when it comes."""
        return 0, 0

    # ---- the endpoint's side -----------------------------------------------------------------
    def chat(self, token: str, body: bytes) -> dict:
        """One chat completion of episode ``token`` (an HttpError for a request it cannot serve)."""
        ep = self._episodes.get(token)
        if ep is None or ep.finished:
            raise HttpError(404, None, "no running episode at this address")
        req = parse_json(body, max_depth=32)
        for name, ok in (("stream", not req.get("stream")), ("n", req.get("n", 1) == 1), ("tools", not req.get("tools"))):
            if not ok:
                raise HttpError(400, name, f"{name}: the recording endpoint answers one non-streamed reply without "
                                "tools (run tools in the program and send their results as messages)")
        t = req.get("temperature")
        if t is not None and abs(float(t) - self._ctx["sampling"].temperature) > 1e-9:
            raise HttpError(400, "temperature", f"temperature: the policy samples at the run's "
                            f"{self._ctx['sampling'].temperature:g} (the loss assumes it); leave it unset")
        if len(ep.calls) >= self.max_turns:
            raise HttpError(429, None, f"max_turns: the episode already made {len(ep.calls)} calls")
        cap = req.get("max_completion_tokens", req.get("max_tokens"))
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
            raise HttpError(400, "max_tokens", f"max_tokens: a whole number >= 1, got {cap!r}")
        msgs = _messages(req)
        call = self._context(ep, msgs)
        if cap is not None:
            call.room = min(call.room, cap)
        with self._cv:
            self._pending.append(call)
            self._cv.notify_all()
        if not call.done.wait(self.timeout):
            raise HttpError(504, None, "the policy did not answer within the episode's deadline")
        return call.reply

    def _context(self, ep: _Episode, msgs: list[dict]) -> _Call:
        """The call's exact token context: the last call's tokens and the new messages' turn where the
        messages extend it, else a fresh rendering (a new chain)."""
        budget, max_prompt = self._ctx["sampling"].max_new_tokens, self._ctx["sampling"].max_prompt_length
        n = len(ep.history)
        if n and msgs[:n] == ep.history:
            turn = self._turn_after_reply(msgs[n:])
            ep.ids += turn
            ep.trained += [0] * len(turn)
            ep.logp += [0.0] * len(turn)
        else:
            text = self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            ids = self.tok(text, add_special_tokens=False)["input_ids"]
            head = system_head(self.tok, msgs, ids) if len(ids) > max_prompt else 0
            ep.prompt, ep.ids, ep.trained, ep.logp = fit_ids(ids, head, max_prompt), [], [], []
            ep.chains += 1
        ep.history = msgs
        return _Call(ep, ep.prompt + ep.ids, budget - len(ep.ids))

    def _turn_after_reply(self, new: list[dict]) -> list[int]:
        """The tokens between the end of the model's reply and its next turn: the end of its turn, the new
        messages, the generation prompt (the text after a stand-in reply in the template's rendering)."""
        full = self.tok.apply_chat_template([{"role": "user", "content": "?"}, {"role": "assistant", "content": MARK}]
                                            + new, tokenize=False, add_generation_prompt=True)
        return self.tok(full[full.find(MARK) + len(MARK):], add_special_tokens=False)["input_ids"]

    # ---- the sampling side ---------------------------------------------------------------------
    def generate(self, engine: RolloutEngine, samples: list[dict], *, group_size: int, sampling: SamplingSettings,
                 system_prompt: str = "", keys: list[int] | None = None, with_logprobs: bool = False,
                 greedy: bool = False) -> Rollout:
        """``group_size`` episodes per sample, grouped by sample, as one Rollout (episodes_rollout)."""
        start = time.perf_counter()
        self._ctx = {"sampling": sampling, "engine": engine, "greedy": greedy,
                     "logprobs": engine.returns_sampling_logprobs and not greedy}
        eps = [_Episode(row=s, key=None if keys is None else keys[i * group_size + j], token=secrets.token_hex(12))
               for i, s in enumerate(samples) for j in range(group_size)]
        self._episodes = {ep.token: ep for ep in eps}
        base = self._serve()
        threads = [threading.Thread(target=self._run, args=(ep, base), daemon=True, name="grpo-agent-program")
                   for ep in eps]
        deadline = time.monotonic() + self.timeout
        for th in threads:
            th.start()
        while any(th.is_alive() for th in threads) and time.monotonic() < deadline:
            self._serve_batch(sum(th.is_alive() for th in threads))
        for ep in eps:
            if not ep.finished:
                ep.finished, ep.error = True, f"the program took longer than {self.timeout:g} s"
        with self._cv:  # calls of abandoned programs get no answer
            self._pending.clear()
        return self._rollout(engine, eps, with_logprobs=with_logprobs, seconds=time.perf_counter() - start)

    def _run(self, ep: _Episode, base: str) -> None:
        import openai

        client = openai.OpenAI(base_url=f"{base}/e/{ep.token}/v1", api_key=self.key,
                               timeout=self.timeout, max_retries=0)
        try:
            ep.result = self.fn(client, dict(ep.row))
        except Exception as e:  # the program is user code: its failure is the episode's
            ep.error = f"{type(e).__name__}: {e}"
        finally:
            ep.finished = True
            client.close()
            with self._cv:
                self._cv.notify_all()

    def _serve_batch(self, live: int) -> None:
        """Wait for calls (all live episodes', or what came within WINDOW_S of the first) and answer them
        with one engine call."""
        with self._cv:
            self._cv.wait_for(lambda: self._pending, timeout=0.2)
            if not self._pending:
                return
            first = time.monotonic()
            self._cv.wait_for(lambda: len(self._pending) >= live or time.monotonic() - first > WINDOW_S, timeout=WINDOW_S)
            batch, self._pending = self._pending, []
        ready = [c for c in batch if c.room > 0]
        for c in batch:
            if c.room <= 0:  # the episode's token budget is spent
                c.ep.truncated = True
                self._answer(c, [], [], "length")
        if ready:
            self._sample(ready)

    def _sample(self, batch: list[_Call]) -> None:
        s, engine = self._ctx["sampling"], self._ctx["engine"]
        sampling = dataclasses.replace(s, max_new_tokens=max(c.room for c in batch),
                                       max_prompt_length=max(len(c.context) for c in batch))
        keys = None if self._ctx["greedy"] or batch[0].ep.key is None else \
            [turn_key(c.ep.key, len(c.ep.calls)) for c in batch]
        ro = engine.generate([c.context for c in batch], group_size=1, sampling=sampling, keys=keys,
                             with_logprobs=self._ctx["logprobs"], greedy=self._ctx["greedy"])
        eos = set(eos_token_ids(engine.model, self.tok))
        for i, c in enumerate(batch):
            n = min(int(ro.completion_mask[i].sum()), c.room)
            ids = ro.completion_ids[i, :n].tolist()
            logp = ro.sampling_logp[i, :n].tolist() if ro.sampling_logp is not None else [0.0] * n
            ended = bool(ids) and ids[-1] in eos
            if not ended:
                c.ep.truncated = True
            self._answer(c, ids, logp, "stop" if ended else "length")

    def _answer(self, c: _Call, ids: list[int], logp: list[float], finish: str) -> None:
        ep = c.ep
        text = self.tok.decode(ids, skip_special_tokens=True)
        kept = ids[:-1] if finish == "stop" else ids  # the end of turn is the template's, as in episodes
        ep.ids += kept
        ep.trained += [1] * len(kept)
        ep.logp += logp[:len(kept)]
        ep.history = ep.history + [{"role": "assistant", "content": text}]
        ep.calls.append({"messages": ep.history[:-1], "reply": text, "prompt_tokens": len(c.context),
                         "completion_tokens": len(ids)})
        c.reply = {"id": f"chatcmpl-{ep.token}-{len(ep.calls)}", "object": "chat.completion", "created": int(time.time()),
                   "model": "policy", "choices": [{"index": 0, "finish_reason": finish, "logprobs": None,
                                                   "message": {"role": "assistant", "content": text}}],
                   "usage": {"prompt_tokens": len(c.context), "completion_tokens": len(ids),
                             "total_tokens": len(c.context) + len(ids)}}
        c.done.set()

    def _rollout(self, engine: RolloutEngine, eps: list[_Episode], *, with_logprobs: bool, seconds: float) -> Rollout:
        out = []
        for ep in eps:
            if not ep.prompt:  # the program never called the model: an empty sample whose reward fails
                ep.prompt = self.tok(self.tok.apply_chat_template(
                    [{"role": "user", "content": str(ep.row.get("prompt", ""))}], tokenize=False,
                    add_generation_prompt=True), add_special_tokens=False)["input_ids"]
            e = Episode(prompt=ep.prompt, tools={}, messages=ep.history, key=ep.key, ids=ep.ids, trained=ep.trained,
                        logp=ep.logp, final_text=ep.calls[-1]["reply"] if ep.calls else "", turns=len(ep.calls),
                        truncated=ep.truncated, done=True, start=0)
            out.append(e)
        ro = episodes_rollout(out, pad_id=self.tok.pad_token_id, with_logprobs=with_logprobs, engine=engine.name,
                              seconds=seconds, prompts_truncated=0, device=next(engine.model.parameters()).device)
        for ep, info in zip(eps, ro.episodes):
            reward = ep.result if isinstance(ep.result, (int, float)) and not isinstance(ep.result, bool) else None
            info.update(agent_reward=None if ep.error else reward, agent_calls=ep.calls, agent_call_count=len(ep.calls),
                        agent_error=ep.error, agent_chains=ep.chains, agent_truncated=ep.truncated, transcript=ep.history)
        self.last_metrics = episode_metrics(ro.episodes)
        return ro


class _Routes(dict):
    """The endpoint's routes: ``POST /e/<token>/v1/chat/completions`` for each episode."""

    def __init__(self, sampler: ProgramSampler):
        super().__init__()
        self.sampler = sampler

    def get(self, key, default=None):
        method, path = key
        parts = path.strip("/").split("/")
        if method == "POST" and len(parts) == 5 and parts[0] == "e" and parts[2:] == ["v1", "chat", "completions"]:
            token = parts[1]
            return Route(fn=lambda body, _ctype: self.sampler.chat(token, body))
        return default

