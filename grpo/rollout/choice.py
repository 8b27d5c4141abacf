"""``rollout_engine=auto``: our decode loop where it is faster than ``generate`` on this machine, at
this batch, measured; ``generate`` elsewhere.

Dimension letters: B prompts, G group size, N = B * G rows, P probe prompt positions.

Why: which of the two is faster depends on the CPU (its vector width, native bf16, memory bandwidth)
and the batch, so it is measured rather than assumed. Both backends draw the same tokens for the same
keys (tested), so choosing between them by speed changes no result. The probe prefills B synthetic
prompts of P tokens (ids from a local generator: a run's random state is untouched), then times
STEPS one-token steps of each: our loop (the decoder step and output layer, its kernels as the plan
says) and HF's decoder forward on its own cache at the same N rows, the per-step work ``generate``
does before its logits processors (which both share). Each backend is timed in ROUNDS rounds, the
two alternating, and its fastest round's median step decides: load from other processes only ever
adds time, so a burst of it during one round does not decide the choice. The result is kept per
(machine, model shapes, N, threads) in this process and in the cache folder, like the kernels.
"""

from __future__ import annotations

import statistics
import time

import torch

from grpo.models.packing import base_model
from grpo.rollout import tuning
from grpo.rollout.types import Rollout
from grpo.rollout.engine import ROLLOUT_ENGINES, RolloutEngine, SamplingSettings, engine_class
from grpo.rollout.fast import FastEngine, cache_keyword, decode_ids, fast_unsupported_reason
from grpo.rollout.hf import HFEngine

PROBE_PROMPT, PROBE_STEPS, ROUNDS = 48, 6, 3  # decisions are kept in tuning.MEASURED, under keys of their own kind


def _probe_ids(model, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """B synthetic prompts [B, P] of ids below the vocabulary size, and their (full) mask."""
    vocab = model.get_output_embeddings().weight.shape[0]
    ids = torch.randint(0, vocab, (b, PROBE_PROMPT), generator=torch.Generator().manual_seed(0))  # [B, P]
    return ids, torch.ones_like(ids)


@torch.no_grad()
def fast_step_seconds(model, b: int, g: int, kernels: str) -> float:
    """Median seconds of one decode step of our loop at N = B * G rows (no row ends: no EOS)."""
    ids, mask = _probe_ids(model, b)
    clock: list[float] = []
    decode_ids(model, ids, mask, g=g, max_new_tokens=PROBE_STEPS + 1, eos=[], kernels=kernels, sampler=None,
               keys=None, with_logprobs=False, temperature=1.0, pad_id=0, clock=clock)
    return statistics.median(b - a for a, b in zip(clock, clock[1:]))


@torch.no_grad()
def hf_step_seconds(model, b: int, g: int) -> float:
    """Median seconds of one HF forward of N one-token rows on the model's own KV cache."""
    from transformers import DynamicCache

    ids, mask = _probe_ids(model, b)
    ids, mask = ids.repeat_interleave(g, 0), mask.repeat_interleave(g, 0)  # [N, P] as generate runs them
    base = base_model(model)  # a LoRA wrapper passes the keyword on
    kw = {cache_keyword(base): DynamicCache(config=model.config)}  # the model's own name for its cache
    out = model(input_ids=ids, attention_mask=mask, use_cache=True, **kw)
    tok = out.logits[:, -1].argmax(-1, keepdim=True)  # [N, 1]
    times = []
    for _ in range(PROBE_STEPS):
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], 1)
        t = time.perf_counter()
        out = model(input_ids=tok, attention_mask=mask, use_cache=True, **kw)
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def step_seconds(model, b: int, g: int, kernels: str) -> dict[str, float]:
    """Per backend, the fastest of ROUNDS rounds' median step seconds, the rounds alternating which
    backend runs first (so that a change of load between two measurements favours neither)."""
    runs = {"fast": lambda: fast_step_seconds(model, b, g, kernels), "hf": lambda: hf_step_seconds(model, b, g)}
    times: dict[str, list[float]] = {"fast": [], "hf": []}
    for r in range(ROUNDS):
        for name in (("fast", "hf") if r % 2 == 0 else ("hf", "fast")):
            times[name].append(runs[name]())
    return {name: min(t) for name, t in times.items()}


def backend_kind(kernels: str, *, peft: bool) -> str:
    """The cache key's kind of a decision: it names the timing method, so that a decision timed by an
    earlier method (one round, more exposed to load) is measured again, not read back."""
    return f"backend min-of-{ROUNDS} {kernels} {'peft' if peft else 'plain'}"


def fast_or_hf(model, *, rows: int, group_size: int, kernels: str = "auto") -> str:
    """'fast' where our loop's step is at most HF's at ``rows`` rows, else 'hf' (measured once per key)."""
    base = base_model(model)
    # generate's speed differs with a LoRA wrapper (its adapters run beside every linear); ours does not
    key = tuning.plan_key(base, rows, kind=backend_kind(kernels, peft=base is not model))
    if key in tuning.MEASURED:
        return tuning.MEASURED[key]["backend"]
    decision, source = tuning.read_cached(key), "cache"
    if decision is None or decision.get("backend") not in ("fast", "hf"):
        b, source = max(1, rows // group_size), "measured"
        was_training = model.training
        model.eval()
        try:
            t = step_seconds(model, b, group_size, kernels)
        finally:
            model.train(was_training)
        decision = {"backend": "fast" if t["fast"] <= t["hf"] else "hf", **t}
        tuning.write_cached(key, decision)
    tuning.note(f"rollout_engine auto ({source}, {rows} rows, {tuning.machine_summary()}): decode step fast "
                f"{decision['fast'] * 1e3:.1f} ms, generate {decision['hf'] * 1e3:.1f} ms -> {decision['backend']}")
    tuning.MEASURED[key] = decision
    return decision["backend"]


def resolve_engine(name: str, model, *, synced: bool = False, rows: int | None = None, group_size: int = 1,
                    kernels: str = "auto") -> str:
    """The backend that runs for config value ``name``. auto: fast where the model supports it
    (decoder-only, a checked architecture, not synced FSDP2 generation) and, given the call's
    ``rows``, where its decode step measured no slower than generate's (``fast_or_hf``), else hf."""
    if name == "auto":
        if fast_unsupported_reason(model, synced=synced) is not None:
            return "hf"
        if rows is None:
            return "fast"
        return fast_or_hf(model, rows=rows, group_size=group_size, kernels=kernels)
    engine_class(name)  # ValueError listing the valid names
    return name


class AutoEngine(RolloutEngine):
    """``rollout_engine=auto``: holds an hf engine and, where the model supports it, a fast one, and
    runs whichever ``resolve_engine`` picks for each call's row count (the trainer's steps and the
    evaluation batches may pick differently). Both draw the same tokens for the same keys, so the
    choice changes the speed only; ``Rollout.engine`` says which ran."""

    name = "auto"
    same_tokens_for_keys = True
    returns_sampling_logprobs = True
    supports_stop = True

    def __init__(self, model, tokenizer, *, synced: bool = False, kernels: str = "auto", options=None):
        super().__init__(model, tokenizer, synced=synced, kernels=kernels, options=options)
        kw = dict(synced=synced, kernels=kernels)
        self.engines: dict[str, RolloutEngine] = {"hf": HFEngine(model, tokenizer, **kw)}
        if fast_unsupported_reason(model, synced=synced) is None:
            self.engines["fast"] = FastEngine(model, tokenizer, **kw)

    def choose(self, rows: int, group_size: int) -> RolloutEngine:
        """The engine that runs a call of ``rows`` rows in groups of ``group_size``."""
        name = resolve_engine("auto", self.model, synced=self.synced, rows=rows, group_size=group_size,
                               kernels=self.kernels)
        return self.engines[name]

    def _generate(self, prompts: list[str], *, group_size: int, sampling: SamplingSettings, keys: list[int] | None,
                  with_logprobs: bool, greedy: bool, stop=None) -> Rollout:
        return self.choose(len(prompts) * group_size, group_size).generate(
            prompts, group_size=group_size, sampling=sampling, keys=keys, with_logprobs=with_logprobs, greedy=greedy,
            stop=stop)

    def sync_weights(self, policy) -> None:
        super().sync_weights(policy)
        for engine in self.engines.values():
            engine.sync_weights(policy)

    def close(self) -> None:
        for engine in self.engines.values():
            engine.close()
        super().close()


ROLLOUT_ENGINES.register(AutoEngine)
