"""Serving engines: one batched decode of several requests' prompts, each row with its own token cap,
deadline and the entropy early stop, found by name in ``SERVE_ENGINES``.

Every engine has the same constructor ``(model, tokenizer, *, kernels)`` and one method,
``decode(prompts, *, stopper, temperature, top_p) -> list[Generation]``; the ``RowStopper`` it is
handed decides after every decoded token which rows end there, and reports a row that ended by
deadline at once (the scheme starts the fallback that moment, seed 003 section 5.3). The fast engine
is the project's own decode loop (grpo.rollout.fast; rows leave the batch as they end), the hf engine
transformers ``generate`` (any causal LM). A vLLM engine plugs in as another entry: it would submit
each row to vLLM's scheduler (continuous batching) and apply the stopper per request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, ClassVar

import torch

from grpo.errors import ConfigError
from grpo.core.entropy_stop import entropy_run_step, next_token_entropy
from grpo.models.packing import base_model
from grpo.rollout.base import encode_prompts, eos_token_ids
from grpo.rollout.decoder import decoder_unsupported_reason
from grpo.rollout.fast import DecodeParts, decode_ids, decode_parts, fast_unsupported_reason
from grpo.rollout.keys import KeyedSampler
from grpo.registry import Registry

FINISH_REASONS = ("stop", "length", "entropy", "deadline")


@dataclass
class Generation:
    """One row's answer: its text, its completion tokens, and why it ended (FINISH_REASONS: EOS,
    the token cap, the entropy early stop, the deadline)."""

    text: str
    tokens: int
    finish: str
    seconds: float


class RowStopper:
    """Stop decisions for the rows of one batch, called after every decoded token.

    caps [n]: each row's token cap; deadlines: each row's time.monotonic() deadline (None: none);
    ``on_deadline(row)`` runs the moment a row is stopped by its deadline; ``pause()``, when given,
    runs after every token before the next is computed (the batcher's yield to another model's
    work). The entropy rule is grpo.core.entropy_stop's (run_length <= 0 disables it)."""

    def __init__(self, caps: list[int], deadlines: list[float | None], *, eos: list[int], entropy_threshold: float,
                 entropy_run: int, on_deadline: Callable[[int], None] | None = None,
                 pause: Callable[[], object] | None = None):
        n = len(caps)
        self.caps = torch.tensor(caps, dtype=torch.long)  # [n]
        self.deadlines = torch.tensor([float("inf") if d is None else d for d in deadlines], dtype=torch.float64)
        self.eos = torch.tensor(eos, dtype=torch.long)
        self.threshold, self.run_length, self.on_deadline, self.pause = entropy_threshold, entropy_run, on_deadline, pause
        self.run = torch.zeros(n, dtype=torch.long)  # [n]
        self.ended = torch.zeros(n, dtype=torch.bool)  # [n] rows that ended (EOS or a stop)
        self.length = torch.zeros(n, dtype=torch.long)  # [n] tokens kept
        self.reason = ["length"] * n

    @property
    def max_new_tokens(self) -> int:
        return int(self.caps.max()) if len(self.caps) else 0

    def __call__(self, t: int, scores: torch.Tensor, tokens: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        """After token t (1-based count) of rows ``live`` [n] drawn from ``scores`` [n, V]: which end now."""
        live, tokens = live.cpu(), tokens.cpu()
        done_before = self.ended[live]  # [n] (the hf engine keeps finished rows in its batch)
        if self.run_length > 0:  # (the fallback runs without the early stop: no entropy to compute)
            step = entropy_run_step(next_token_entropy(scores).cpu(), self.run[live], threshold=self.threshold,
                                    run_length=self.run_length)
            self.run[live], early = step.run, step.stop
        else:
            early = torch.zeros(len(live), dtype=torch.bool)
        eos = torch.isin(tokens, self.eos)  # [n]
        late = self.deadlines[live] <= time.monotonic()  # [n]
        capped = self.caps[live] <= t  # [n]
        stop = ~done_before & (eos | late | early | capped)  # [n]
        for i in stop.nonzero()[:, 0].tolist():
            row = int(live[i])
            self.ended[row] = True
            self.length[row] = t
            reason = "stop" if eos[i] else "deadline" if late[i] else "entropy" if early[i] else "length"
            self.reason[row] = reason
            if reason == "deadline" and self.on_deadline is not None:
                self.on_deadline(row)
        if self.pause is not None and not bool((stop | done_before).all()):
            self.pause()
        return (stop | done_before).to(scores.device)

    def finish(self, ids: torch.Tensor, tokenizer, seconds: float) -> list[Generation]:
        """The Generations of decoded ids [n, T]: each row cut where it ended (EOS not in the text)."""
        out = []
        for row in range(ids.shape[0]):
            n_tok = int(self.length[row]) if self.ended[row] else ids.shape[1]
            keep = ids[row, :n_tok].tolist()
            if self.reason[row] == "stop" and keep:
                keep = keep[:-1]
            out.append(Generation(tokenizer.decode(keep, skip_special_tokens=True), n_tok, self.reason[row], seconds))
        return out


class ServeEngine:
    """A model behind the server: batched decoding of rendered prompts."""

    name: ClassVar[str] = ""

    def __init__(self, model, tokenizer, *, kernels: str = "auto"):
        self.model, self.tokenizer, self.kernels = model, tokenizer, kernels
        self.eos = eos_token_ids(model, tokenizer)
        model.eval()

    def prompt_tokens(self, prompt: str) -> int:
        return len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def decode(self, prompts: list[str], *, stopper: RowStopper, temperature: float, top_p: float) -> list[Generation]:
        raise NotImplementedError


SERVE_ENGINES: Registry[type[ServeEngine]] = Registry("serving engine", field="--engine", name_of=lambda cls: cls.name)
register = SERVE_ENGINES.register  # class decorator: the entry is named by the class's ``name``


def make_serve_engine(name: str, model, tokenizer, *, kernels: str = "auto") -> ServeEngine:
    """The engine ``name`` ('auto': fast where the model allows it, else hf) on ``model``."""
    if name == "auto":
        name = "fast" if fast_unsupported_reason(model) is None else "hf"
    return SERVE_ENGINES.lookup(name, also=("auto",))(model, tokenizer, kernels=kernels)


@register
class FastServeEngine(ServeEngine):
    """grpo.rollout.fast's decode loop: one prefill per batch, rows leave as they end."""

    name = "fast"
    MAX_KEPT_PLANS = 2  # each kept plan holds a folded, packed copy of the weights

    def __init__(self, model, tokenizer, *, kernels: str = "auto"):
        reason = fast_unsupported_reason(model)
        if reason is not None:
            raise ConfigError(f"--engine fast: {reason}")
        super().__init__(model, tokenizer, kernels=kernels)
        self._parts: dict[int, DecodeParts | None] = {}  # rows -> the decode parts (shared across equal plans)

    def parts(self, rows: int, capacity: int) -> DecodeParts | None:
        """The decode step for ``rows`` rows, built on first use and kept: the served weights never
        change, so folding and packing them once per model (not once per batch) is enough. Row
        counts whose measured kernel plans agree share one; past ``MAX_KEPT_PLANS`` distinct plans a
        new row count takes the nearest kept one's (the same numbers to fp32 rounding, maybe slower)."""
        if decoder_unsupported_reason(base_model(self.model), capacity) is not None:
            return None  # (a sliding window shorter than this batch's positions) decode_ids steps through HF's decoder
        if rows not in self._parts:
            kept = {id(p): p for p in self._parts.values() if p is not None}
            if len(kept) >= self.MAX_KEPT_PLANS:  # memory: the nearest row count's parts (only speed differs)
                self._parts[rows] = self._parts[min((r for r, p in self._parts.items() if p is not None),
                                                    key=lambda r: abs(r - rows))]
                return self._parts[rows]
            made = decode_parts(self.model, rows, capacity, kernels=self.kernels)
            same = [p for p in kept.values() if made is not None and p.products == made.products]
            self._parts[rows] = same[0] if same else made
        return self._parts[rows]

    @torch.no_grad()
    def decode(self, prompts: list[str], *, stopper: RowStopper, temperature: float, top_p: float) -> list[Generation]:
        start = time.perf_counter()
        ids, mask, _ = encode_prompts(self.tokenizer, prompts, max_length=10**9)  # [n, P]; limits are the server's
        sampler = None if temperature <= 0 else KeyedSampler([], ids.shape[1], temperature=temperature, top_p=top_p)
        capacity = ids.shape[1] + stopper.max_new_tokens
        out = decode_ids(self.model, ids, mask, g=1, max_new_tokens=stopper.max_new_tokens, eos=self.eos,
                         sampler=sampler, keys=None, with_logprobs=False, temperature=max(temperature, 1e-6),
                         pad_id=self.tokenizer.pad_token_id, kernels=self.kernels, stop_rows=stopper,
                         parts=self.parts(ids.shape[0], capacity))
        return stopper.finish(out["ids"], self.tokenizer, time.perf_counter() - start)


@register
class HFServeEngine(ServeEngine):
    """transformers ``generate`` with the stopper as a per-row stopping criterion (the entropy of the
    scores after generate's processors: the raw logits when greedy)."""

    name = "hf"

    @torch.no_grad()
    def decode(self, prompts: list[str], *, stopper: RowStopper, temperature: float, top_p: float) -> list[Generation]:
        from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

        start = time.perf_counter()
        ids, mask, _ = encode_prompts(self.tokenizer, prompts, max_length=10**9)  # [n, P]
        width, rows, seen = ids.shape[1], torch.arange(ids.shape[0]), {}

        class Record(LogitsProcessor):  # generate hands its stopping criteria no scores unless it keeps them all
            def __call__(self, input_ids, scores):
                seen["scores"] = scores
                return scores

        class Criterion(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                return stopper(input_ids.shape[1] - width, seen["scores"], input_ids[:, -1], rows)

        sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) if temperature > 0 else \
            dict(do_sample=False, temperature=None, top_p=None, top_k=None)
        out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=stopper.max_new_tokens,
                                  eos_token_id=self.eos, pad_token_id=self.tokenizer.pad_token_id,
                                  stopping_criteria=StoppingCriteriaList([Criterion()]),
                                  logits_processor=LogitsProcessorList([Record()]), **sampling)
        return stopper.finish(out[:, width:], self.tokenizer, time.perf_counter() - start)
