"""Serving engines: continuous (iteration-level) batching of requests, each row with its own token
cap, deadline and the entropy early stop, found by name in ``SERVE_ENGINES``.

An engine holds the rows being decoded. ``admit(job)`` adds one (it joins at the next step); each
``step()`` runs one iteration over every row: a decoding row gets its next token, a row being
prefilled its next chunk of prompt, in the same forward (Orca's iteration-level scheduling, Yu et al.
2022; chunked prefill, Sarathi, Agrawal et al. 2023). A row leaves the moment it ends: EOS, its cap,
the entropy stop, or its deadline (its future resolves then; the scheme starts the fallback at once,
seed 003 section 5.3). Nothing waits for a batch to finish, and no row is padded to another's length.

Every engine has the constructor ``(model, tokenizer, *, kernels, max_rows, max_len)``. The fast
engine is the project's own decode step over a paged KV cache with prefix caching (grpo.rollout.paged);
the hf engine runs transformers' forward row by row, each row with its own cache (any causal LM).
vLLM's own engine serves with ``--engine vllm`` (grpo.serve.vllm_lanes).
"""

from __future__ import annotations

import math
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Callable, ClassVar

import torch

from grpo.core.entropy_stop import next_token_entropy
from grpo.errors import ConfigError
from grpo.models.packing import base_model
from grpo.rollout.types import eos_token_ids
from grpo.rollout.decoder import decoder_unsupported_reason
from grpo.rollout.fast import cache_keyword, fast_unsupported_reason, step_products
from grpo.rollout.paged import PAGE, PagedDecoder, PagePool, PrefixCache
from grpo.registry import Registry
from grpo.serve.logprobs import TokenLogprob, top_token_logprobs

FINISH_REASONS = ("stop", "length", "entropy", "deadline")


@dataclass
class Generation:
    """One row's answer: its text, its completion tokens, and why it ended (FINISH_REASONS: EOS,
    the token cap, the entropy early stop, the deadline); ``logprobs``, when the request asked for
    them, one per token of the text (the end-of-sequence token is not part of it)."""

    text: str
    tokens: int
    finish: str
    seconds: float
    logprobs: list[TokenLogprob] | None = None


def resolve(future: Future, result: Generation | None = None, error: BaseException | None = None) -> None:
    """Set a future once; later attempts (a deadline already answered, a caller that gave up) do nothing."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass


@dataclass(eq=False)
class Job:
    """One request to decode. ``deadline``: a time.monotonic() time (None: none); ``entropy_run`` <= 0
    turns the early stop off; ``on_tokens(ids)``, when given, is called from the engine's thread with
    the row's tokens so far after each new one (streaming); ``top_logprobs`` (None: none asked) makes
    each token carry its log-prob and that many alternatives (Generation.logprobs)."""

    prompt: str | list[int]
    cap: int
    deadline: float | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    entropy_threshold: float = 0.0
    entropy_run: int = 0
    on_tokens: Callable[[list[int]], None] | None = None
    lane: object = None  # the lane that submitted it (grpo.serve.batcher)
    future: Future = field(default_factory=Future)
    ids: list[int] | None = None  # the prompt's token ids, once the engine encoded it
    top_logprobs: int | None = None


class Row:
    """A job in an engine: its prompt ids, how many are in the cache, the tokens made, the stop state."""

    def __init__(self, job: Job, ids: list[int], step: int):
        self.job, self.ids = job, ids
        self.done = 0  # prompt tokens in the KV cache
        self.out: list[int] = []  # new tokens
        self.logprobs: list[TokenLogprob] = []  # theirs, when the job asks for them
        self.run = 0  # consecutive tokens below the entropy threshold
        self.start, self.admitted_step = time.perf_counter(), step
        self.first_token_step: int | None = None  # the engine step that made its first token
        self.pages: list[int] = []
        self.cache = None

    @property
    def prefilling(self) -> bool:
        return self.done < len(self.ids)

    def steps_left(self, expected_tokens: int, chunk: int) -> int:
        """Steps this row still needs if its answer is ``expected_tokens`` long."""
        return math.ceil((len(self.ids) - self.done) / chunk) + max(min(expected_tokens, self.job.cap) - len(self.out), 1)


class ServeEngine:
    """A model behind the server: the rows it decodes, stepped by the scheduler (grpo.serve.batcher)."""

    name: ClassVar[str] = ""
    OPTIONS: ClassVar[tuple[str, ...]] = ()  # keyword arguments of its own (make_serve_engine's options)

    def __init__(self, model, tokenizer, *, kernels: str = "auto", max_rows: int = 8, max_len: int = 2048):
        self.model, self.tokenizer, self.kernels = model, tokenizer, kernels
        self.max_rows, self.max_len = max_rows, max_len
        self.eos = eos_token_ids(model, tokenizer)
        self.rows: list[Row] = []
        self.steps = 0  # steps run
        self.fed = 0  # tokens fed to the model, prompts and new tokens (prefix caching lowers it)
        self.step_seconds: float | None = None  # a moving average of a step's time (the scheduler's estimate)
        self.generator = torch.Generator().manual_seed(0)
        model.eval()

    def prompt_tokens(self, prompt: str) -> int:
        return len(self.encode(prompt))

    def encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, list):
            return [int(t) for t in prompt]
        return self.tokenizer(prompt, add_special_tokens=False)["input_ids"]

    def job_ids(self, job: Job) -> list[int]:
        if job.ids is None:
            job.ids = self.encode(job.prompt)
        return job.ids

    def can_admit(self, job: Job) -> bool:
        return len(self.rows) < self.max_rows

    def admit(self, job: Job) -> None:
        """The job joins the rows decoded from the next step on."""
        ids = self.job_ids(job)
        if not ids or len(ids) + job.cap > self.max_len:
            resolve(job.future, error=ValueError(f"a prompt of {len(ids)} tokens plus {job.cap} new ones: outside "
                                                 f"(0, {self.max_len}] positions"))
            return
        self.rows.append(self._make_row(job, ids))

    def _make_row(self, job: Job, ids: list[int]) -> Row:
        return Row(job, ids, self.steps)

    def drop_late(self) -> None:
        """Rows past their deadline, or whose caller gave up, leave (answered 'deadline')."""
        now = time.monotonic()
        for row in list(self.rows):
            if row.job.future.done() or (row.job.deadline is not None and row.job.deadline <= now):
                self._finish(row, "deadline")

    @torch.no_grad()
    def step(self) -> None:
        """One iteration: rows past their deadline (or whose caller gave up) leave first, then every
        other row advances by one token or one prefill chunk."""
        self.drop_late()
        if not self.rows:
            return
        t0 = time.perf_counter()
        try:
            self._step()
        except BaseException as e:  # a failing step fails its own rows; the engine keeps serving
            for row in list(self.rows):
                self._release(row)
                resolve(row.job.future, error=e)
            self.rows.clear()
        dt = time.perf_counter() - t0
        self.step_seconds = dt if self.step_seconds is None else 0.8 * self.step_seconds + 0.2 * dt
        self.steps += 1

    def _step(self) -> None:
        raise NotImplementedError

    def _advance(self, rows: list[Row], scores: torch.Tensor) -> None:
        """Each row's next token from its float32 scores [n, V], then its stop rules (the entropy of
        the raw logits, seed 003's "logit entropy")."""
        tokens = self._pick(rows, scores)  # [n]
        want = [i for i, r in enumerate(rows) if r.job.entropy_run > 0]
        entropy = dict(zip(want, next_token_entropy(scores[want]).tolist())) if want else {}
        asked = [i for i, r in enumerate(rows) if r.job.top_logprobs is not None]
        if asked:
            for i, lp in zip(asked, top_token_logprobs(scores[asked], tokens[asked].tolist(),
                                                       [rows[i].job.top_logprobs for i in asked])):
                rows[i].logprobs.append(lp)
        now = time.monotonic()
        for i, (row, tok) in enumerate(zip(rows, tokens.tolist())):
            row.out.append(tok)
            if row.first_token_step is None:
                row.first_token_step = self.steps
            job = row.job
            if i in entropy:
                row.run = row.run + 1 if entropy[i] < job.entropy_threshold else 0
            if job.on_tokens is not None:
                job.on_tokens(list(row.out))
            if tok in self.eos:
                self._finish(row, "stop")
            elif job.entropy_run > 0 and row.run >= job.entropy_run:
                self._finish(row, "entropy")
            elif len(row.out) >= job.cap:
                self._finish(row, "length")
            elif job.deadline is not None and job.deadline <= now:
                self._finish(row, "deadline")

    def _pick(self, rows: list[Row], scores: torch.Tensor) -> torch.Tensor:
        """Greedy rows: the argmax; sampled rows: a draw from softmax(scores / temperature) within top_p."""
        tokens = scores.argmax(-1)  # [n]
        for i, row in enumerate(rows):
            t, p = row.job.temperature, row.job.top_p
            if t <= 0:
                continue
            logits = scores[i] / t  # [V]
            if p < 1.0:
                order = logits.argsort(descending=True)  # [V]
                probs = torch.softmax(logits[order], -1)
                cut = (probs.cumsum(-1) - probs) >= p  # past the nucleus (the first token always stays)
                logits[order[cut]] = float("-inf")
            tokens[i] = torch.multinomial(torch.softmax(logits, -1), 1, generator=self.generator)[0]
        return tokens

    def _finish(self, row: Row, reason: str) -> None:
        if row in self.rows:
            self.rows.remove(row)
        self._release(row)
        keep = row.out[:-1] if reason == "stop" and row.out else row.out
        text = self.tokenizer.decode(keep, skip_special_tokens=True) if reason != "deadline" else ""
        lane = row.job.lane
        if lane is not None and reason in ("stop", "entropy"):
            lane.record_length(len(row.out))
        logprobs = row.logprobs[:len(keep)] if row.job.top_logprobs is not None and reason != "deadline" else None
        resolve(row.job.future, Generation(text, len(row.out), reason, time.perf_counter() - row.start, logprobs))

    def _release(self, row: Row) -> None:
        """Give back what the row holds (cache pages)."""


# ServeEngine classes, and engines that build the whole server state themselves (a ``build_state``:
# vLLM's, grpo.serve.vllm_lanes)
SERVE_ENGINES: Registry[type] = Registry("serving engine", field="--engine", name_of=lambda cls: cls.name)


def make_serve_engine(name: str, model, tokenizer, *, kernels: str = "auto", max_rows: int = 8,
                      max_len: int = 2048, options: dict | None = None) -> ServeEngine:
    """The engine ``name`` ('auto': fast where the model allows it, else hf) on ``model``;
    ``options``: settings only some engines take (each takes its ``OPTIONS``)."""
    if name == "auto":
        name = "fast" if fast_unsupported_reason(model) is None and \
            decoder_unsupported_reason(base_model(model), max_len) is None else "hf"
    cls = SERVE_ENGINES.lookup(name, also=("auto",))
    if not isinstance(cls, type) or not issubclass(cls, ServeEngine):
        raise ConfigError(f"--engine {name}: builds the whole server (its build_state), not one engine on a model")
    own = {k: v for k, v in (options or {}).items() if k in cls.OPTIONS}
    return cls(model, tokenizer, kernels=kernels, max_rows=max_rows, max_len=max_len, **own)


class FastServeEngine(ServeEngine):
    """grpo's decode step over a paged KV cache (grpo.rollout.paged): one forward per step over every
    row's token or prompt chunk, the products packed once (the served weights never change), the
    full pages of prompts kept for reuse (the chat template's system prompt is computed once).
    ``dtype`` (grpo.rollout.tuning.PRECISIONS): float32 products (the trained weights exactly), the
    weights rounded to bfloat16 (half the bytes a step reads; float32 sums), or auto (per product,
    whichever measured faster here)."""

    name = "fast"
    OPTIONS = ("max_step_tokens", "prefix_pages", "dtype")

    def __init__(self, model, tokenizer, *, kernels: str = "auto", max_rows: int = 8, max_len: int = 2048,
                 max_step_tokens: int = 128, prefix_pages: int = 256, dtype: str = "float32"):
        base = base_model(model)
        reason = fast_unsupported_reason(model) or decoder_unsupported_reason(base, max_len)
        if reason is not None:
            raise ConfigError(f"--engine fast: {reason}")
        super().__init__(model, tokenizer, kernels=kernels, max_rows=max_rows, max_len=max_len)
        from grpo.rollout import native

        lib = native.library()
        try:
            linears, self.head = step_products(base, max_rows, kernels, use_native=lib is not None, dtype=dtype)
        except ValueError as e:
            raise ConfigError(f"--engine fast: {e}") from e
        self.pool = PagePool(max_rows * math.ceil(max_len / PAGE) + prefix_pages)
        self.prefix = PrefixCache(self.pool, max_pages=prefix_pages)
        self.decoder = PagedDecoder(base, pages=self.pool.pages, lib=lib, linears=linears)
        self.max_step_tokens = max(max_step_tokens, max_rows + PAGE)

    def _pages_needed(self, ids: list[int], cap: int) -> int:
        return math.ceil((len(ids) + cap) / PAGE)

    def can_admit(self, job: Job) -> bool:
        if len(self.rows) >= self.max_rows:
            return False
        ids = self.job_ids(job)
        if not ids or len(ids) + job.cap > self.max_len:
            return True  # admit() refuses it with its error
        need = self._pages_needed(ids, job.cap)
        if self.pool.available() < need:
            self.prefix.evict(need)
        return self.pool.available() >= need

    def _make_row(self, job: Job, ids: list[int]) -> Row:
        row = Row(job, ids, self.steps)
        shared = self.prefix.match(ids)  # the kept pages of its prefix: those tokens are not computed again
        for page in shared:
            self.pool.ref(page)
        row.pages = shared + [self.pool.take() for _ in range(self._pages_needed(ids, job.cap) - len(shared))]
        row.done = len(shared) * PAGE
        return row

    def _release(self, row: Row) -> None:
        for page in row.pages:
            self.pool.release(page)
        row.pages = []

    def _step(self) -> None:
        feed = [(r, len(r.ids) + len(r.out) - 1, 1) for r in self.rows if not r.prefilling]  # (row, first pos, count)
        budget = self.max_step_tokens - len(feed)
        for r in self.rows:
            if r.prefilling and budget > 0:
                n = min(len(r.ids) - r.done, budget)
                feed.append((r, r.done, n))
                budget -= n
        width = max(math.ceil((p + n) / PAGE) for _, p, n in feed)
        table = torch.zeros(len(feed), width, dtype=torch.long)  # [R, W]
        tokens, rows, positions, last = [], [], [], []
        for i, (r, p, n) in enumerate(feed):
            table[i, :width] = torch.tensor((r.pages + [0] * width)[:width])
            tokens += r.ids[p:p + n] if r.prefilling else [r.out[-1]]
            rows += [i] * n
            positions += range(p, p + n)
            last.append(len(tokens) - 1)
        hidden = self.decoder.forward(torch.tensor(tokens), table, torch.tensor(rows), torch.tensor(positions))  # [M, H]
        self.fed += len(tokens)
        ready = []  # rows whose last fed token gives logits: decoding rows, and prompts prefilled to the end
        for (r, p, n), at in zip(feed, last):
            if r.prefilling:
                r.done = p + n
                if r.prefilling:
                    continue
                self.prefix.add(r.ids, r.pages)
            ready.append((r, at))
        if ready:
            scores = self.head(hidden[[at for _, at in ready]]).float()  # [n, V]
            self._advance([r for r, _ in ready], scores)


SERVE_ENGINES.register(FastServeEngine)


class HFServeEngine(ServeEngine):
    """transformers' forward, row by row, each row with its own KV cache (any causal LM; no prefix
    caching): continuous batching in its admission and leaving, one forward per row per step."""

    name = "hf"

    def __init__(self, model, tokenizer, **kw):
        super().__init__(model, tokenizer, **kw)
        # the forward's name for its KV cache (the decoder's: a model may wrap its forward in **kwargs)
        self.keyword = cache_keyword(model.get_decoder()) if hasattr(model, "get_decoder") else "past_key_values"

    def _make_row(self, job: Job, ids: list[int]) -> Row:
        from transformers import DynamicCache

        row = Row(job, ids, self.steps)
        row.cache = DynamicCache(config=self.model.config)
        return row

    def _release(self, row: Row) -> None:
        row.cache = None

    def _step(self) -> None:
        rows, scores = list(self.rows), []
        for r in rows:
            fed = r.ids[r.done:] if r.prefilling else [r.out[-1]]
            out = self.model(input_ids=torch.tensor([fed]), use_cache=True, **{self.keyword: r.cache})
            scores.append(out.logits[0, -1].float())  # [V]
            r.done = len(r.ids)
            self.fed += len(fed)
        self._advance(rows, torch.stack(scores))  # [n, V]


SERVE_ENGINES.register(HFServeEngine)
