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
MAX_EPISODES = 1024  # episodes of one step (prompts_per_step * num_generations per process) the endpoint serves
# request fields that would change what is sampled (the loss assumes the run's own sampling) or that this
# endpoint does not serve: refused by name rather than ignored
REFUSED = {"stream": "one reply, not streamed", "tools": "run tools in the program and send their results as "
           "messages", "tool_choice": "no tools", "functions": "no tools", "response_format": "no constrained output",
           "stop": "the reply ends at the model's end of turn", "logit_bias": "the policy samples unchanged",
           "top_p": "the run's top_p applies", "top_k": "the run's top_k applies", "min_p": "the run's min_p applies",
           "presence_penalty": "the run's sampling applies", "frequency_penalty": "the run's sampling applies",
           "repetition_penalty": "the run's repetition_penalty applies", "seed": "each call draws from its episode's key"}


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
    busy: bool = False  # a call is waiting for its reply (one at a time: the calls of an episode form one context)
    lock: threading.Lock = field(default_factory=threading.Lock)


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
        self._one_step = threading.Lock()
        self._ctx: dict = {}
        self.last_metrics: dict = {}
        self.server: GuardedServer | None = None

    def _serve(self) -> str:
        """The endpoint's base URL, started on a free loopback port the first time (again after close)."""
        if self.server is None:
            # every live episode holds one connection while its call waits for the batch
            self.server = GuardedServer(("127.0.0.1", 0), _Routes(self), api_key=self.key,
                                        limits=HttpLimits(max_connections=MAX_EPISODES))
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
        req = parse_json(body, max_depth=32)
        self._check(req)
        cap = req.get("max_completion_tokens", req.get("max_tokens"))
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
            raise HttpError(400, "max_tokens", f"max_tokens: a whole number >= 1, got {cap!r}")
        msgs = _messages(req)
        if ep is None:
            raise HttpError(404, None, "no running episode at this address")
        with ep.lock:
            if ep.finished:
                raise HttpError(404, None, "no running episode at this address (it ended)")
            if ep.busy:
                raise HttpError(409, None, "the episode's last call has not been answered: its calls are one "
                                "conversation, made one after the other")
            if len(ep.calls) >= self.max_turns:
                raise HttpError(429, None, f"max_turns: the episode already made {len(ep.calls)} calls")
            call = self._context(ep, msgs)
            ep.busy = True
        try:
            if cap is not None:
                call.room = min(call.room, cap)
            with self._cv:
                self._pending.append(call)
                self._cv.notify_all()
            if not call.done.wait(self.timeout) or call.reply is None:
                raise HttpError(503, None, "the policy gave no answer (the episode's deadline passed or the step ended)")
            return call.reply
        finally:
            with ep.lock:
                ep.busy = False

    def _check(self, req: dict) -> None:
        """400 for a request whose settings this endpoint cannot honour, naming the field and why."""
        for name, why in REFUSED.items():
            if req.get(name) not in (None, False, [], {}):
                raise HttpError(400, name, f"{name}: not served by the recording endpoint ({why})")
        if req.get("n", 1) != 1:
            raise HttpError(400, "n", "n: one reply per call (the group is the episodes of a row)")
        t = req.get("temperature")
        if t is not None and (not isinstance(t, (int, float)) or abs(float(t) - self._ctx["sampling"].temperature) > 1e-9):
            raise HttpError(400, "temperature", f"temperature: the policy samples at the run's "
                            f"{self._ctx['sampling'].temperature:g} (the loss assumes it); leave it unset")

    def _context(self, ep: _Episode, msgs: list[dict]) -> _Call:
        """The call's exact token context: the last call's tokens and the new messages' turn where the
        messages extend it, else a fresh rendering (a new chain)."""
        budget, max_prompt = self._ctx["sampling"].max_new_tokens, self._ctx["sampling"].max_prompt_length
        n = len(ep.history)
        if n and msgs[:n] == ep.history:
            turn = self._turn_after_reply(msgs[n:])
            if turn and ep.trained and ep.trained[-1] and ep.ids[-1] == turn[0] and turn[0] in self._ctx["eos"]:
                turn = turn[1:]  # the reply's own end of turn is the sampled (trained) one
            turn = turn[:max(0, budget - len(ep.ids))]  # the episode's token budget holds the turns between too
            ep.truncated |= len(ep.ids) + len(turn) >= budget
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
        if MARK not in full:
            raise HttpError(400, "messages", "messages: the chat template does not render an assistant turn's text "
                            "as given, so the conversation cannot continue the recorded tokens")
        return self.tok(full[full.find(MARK) + len(MARK):], add_special_tokens=False)["input_ids"]

    # ---- the sampling side ---------------------------------------------------------------------
    def generate(self, engine: RolloutEngine, samples: list[dict], *, group_size: int, sampling: SamplingSettings,
                 system_prompt: str = "", keys: list[int] | None = None, with_logprobs: bool = False,
                 greedy: bool = False) -> Rollout:
        """``group_size`` episodes per sample, grouped by sample, as one Rollout (episodes_rollout). One call
        at a time: the endpoint serves one step's episodes."""
        if len(samples) * group_size > MAX_EPISODES:
            raise ConfigError(f"agent: {len(samples) * group_size} episodes at once; the endpoint serves at most "
                              f"{MAX_EPISODES} (lower prompts_per_step or num_generations)")
        with self._one_step:
            return self._generate(engine, samples, group_size=group_size, sampling=sampling, keys=keys,
                                  with_logprobs=with_logprobs, greedy=greedy)

    def _generate(self, engine: RolloutEngine, samples: list[dict], *, group_size: int, sampling: SamplingSettings,
                  keys: list[int] | None, with_logprobs: bool, greedy: bool) -> Rollout:
        start = time.perf_counter()
        # the recorded log-probs are every call's (whatever the step asks: they are what the episode logs)
        self._ctx = {"sampling": sampling, "engine": engine, "greedy": greedy,
                     "logprobs": engine.returns_sampling_logprobs and not greedy,
                     "eos": set(eos_token_ids(engine.model, self.tok))}
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
            with ep.lock:
                if not ep.finished:
                    ep.finished, ep.error = True, f"the program took longer than {self.timeout:g} s"
        with self._cv:  # calls of abandoned programs get no answer
            late, self._pending = self._pending, []
        for c in late:
            c.done.set()
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
        current = [c for c in batch if self._episodes.get(c.ep.token) is c.ep]
        for c in batch:
            if c not in current:  # a call of an earlier step's abandoned program: no answer
                c.done.set()
        ready = [c for c in current if c.room > 0]
        for c in current:
            if c.room <= 0:  # the episode's token budget is spent
                c.ep.truncated = True
                self._answer(c, [], [], "length")
        if ready:
            try:
                self._sample(ready)
            finally:  # an engine failure answers every waiting call (with nothing) before it propagates
                for c in ready:
                    c.done.set()

    def _sample(self, batch: list[_Call]) -> None:
        s, engine = self._ctx["sampling"], self._ctx["engine"]
        sampling = dataclasses.replace(s, max_new_tokens=max(c.room for c in batch),
                                       max_prompt_length=max(len(c.context) for c in batch))
        keys = None if self._ctx["greedy"] or batch[0].ep.key is None else \
            [turn_key(c.ep.key, len(c.ep.calls)) for c in batch]
        ro = engine.generate([c.context for c in batch], group_size=1, sampling=sampling, keys=keys,
                             with_logprobs=self._ctx["logprobs"], greedy=self._ctx["greedy"])
        eos = self._ctx["eos"]
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
        with ep.lock:  # the reply's tokens, its end of turn included, are the model's own: trained
            ep.ids += ids
            ep.trained += [1] * len(ids)
            ep.logp += logp[:len(ids)]
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
            with ep.lock:  # an abandoned program's thread may still be writing: a copy of what it recorded
                ep.ids, ep.trained, ep.logp = list(ep.ids), list(ep.trained), list(ep.logp)
                n = min(len(ep.ids), len(ep.trained), len(ep.logp))
                ep.ids, ep.trained, ep.logp = ep.ids[:n], ep.trained[:n], ep.logp[:n]
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

