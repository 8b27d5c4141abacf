"""Our own decode loop for decoder-only HF models whose forward takes a KV ``cache``.

It draws the same tokens as ``generate_rollout(..., keys=...)`` (and as greedy ``generate``) while
doing only the work those tokens need:
  - each distinct prompt is prefilled ONCE and its KV cache is shared by the G completions of its
    group (repeat-interleaved after the prefill), instead of prefilling N = B*G copies;
  - a row that emits EOS leaves the batch (its cache rows are dropped), so the decode batch shrinks
    as completions end instead of computing padding up to the longest one;
  - the KV cache is written into buffers made once (no per-step concatenation of the whole cache);
  - each fp32 product (q/k/v, o, gate/up, down, the output layer) runs the kernel measured fastest
    for this machine, model and row count (tuning.py: decode_ops.c's panel product, oneDNN's inner
    product on weights packed once per rollout, or MKL), LoRA adapters merged into those weights;
  - per step: one decoder forward on the live rows' last tokens, the output layer on the last
    position only, the KeyedSampler's warpers and per-(key, t) Gumbel noise on those rows, an argmax.
Sampling is KeyedSampler itself (the same warpers and noise), so a row's tokens depend only on its
key, as in the HF path (Gumbel-max: Gumbel 1954; Maddison et al. 2014).
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass

import torch

from grpo import core
from grpo.models.packing import base_model
from grpo.rollout.types import Rollout, encode_for_rollout, finish_rollout
from grpo.rollout.engine import ROLLOUT_ENGINES, RolloutEngine, SamplingSettings, row_stopper
from grpo.rollout.keys import KeyedSampler
from grpo.rollout import native
from grpo.rollout.decoder import TorchDecoder, RowCache, decoder_unsupported_reason
from grpo.rollout.kernels import onednn_available, packed_linears
from grpo.rollout.tuning import KernelPlan, kernel_plan, needs_native, parse_override

# Architectures whose forward and DynamicCache the loop below has been checked against.
FAST_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def fast_unsupported_reason(model, *, synced: bool = False) -> str | None:
    """Why the fast backend cannot sample from ``model`` (None when it can)."""
    if synced:
        return "synced (FSDP2) generation steps every process together; only generate does that"
    config = getattr(model, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return "not a decoder-only transformers model"
    if getattr(config, "quantization_config", None) is not None:
        return "a quantized model (its weights are packed, e.g. load_in_4bit); generate samples it"
    if getattr(config, "model_type", None) not in FAST_MODEL_TYPES:
        return f"model_type {getattr(config, 'model_type', None)!r} is not one of {FAST_MODEL_TYPES}"
    return None


def _pick(scores: torch.Tensor, sampler: KeyedSampler | None, t: int, keys: list[int] | None,
          seen: torch.Tensor | None = None) -> torch.Tensor:
    """Next token of each live row from its float32 scores [n, V]: greedy, keyed Gumbel-max, or
    (no keys) a multinomial draw from q's softmax, as ``generate(do_sample=True)``; ``seen`` [n, V]:
    the rows' context tokens (the repetition penalty)."""
    if sampler is None:
        return scores.argmax(-1)  # [n]
    if keys is not None:
        return sampler.draw(scores, t, keys, seen=seen)  # [n]
    return torch.multinomial(torch.softmax(sampler.process(scores, seen), -1), 1)[:, 0]  # [n]


def _buffer_cache(model, capacity: int):
    """A DynamicCache whose full-attention layers write into buffers of ``capacity`` positions made
    once, instead of concatenating the whole cache with each new token (a copy of every layer's keys
    and values per step). The attention reads a view of the filled part: the same numbers."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    class BufferLayer(DynamicLayer):
        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
                n, h, _, d = key_states.shape
                self.kbuf, self.vbuf = (x.new_empty(n, h, capacity, d) for x in (key_states, value_states))
                self.length = 0
            end = self.length + key_states.shape[-2]
            self.kbuf[:, :, self.length:end] = key_states  # [n, H, s, D] into [n, H, capacity, D]
            self.vbuf[:, :, self.length:end] = value_states
            self.length = end
            self.keys, self.values = self.kbuf[:, :, :end], self.vbuf[:, :, :end]
            return self.keys, self.values

        def batch_repeat_interleave(self, repeats: int) -> None:
            self.kbuf, self.vbuf = self.kbuf.repeat_interleave(repeats, 0), self.vbuf.repeat_interleave(repeats, 0)
            self.keys, self.values = self.kbuf[:, :, :self.length], self.vbuf[:, :, :self.length]

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            self.kbuf, self.vbuf = self.kbuf[indices], self.vbuf[indices]
            self.keys, self.values = self.kbuf[:, :, :self.length], self.vbuf[:, :, :self.length]

    cache = DynamicCache(config=model.config)
    cache.layers = [BufferLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def cache_keyword(decoder) -> str:
    """The name ``decoder.forward`` takes its KV cache under: ``cache`` in transformers 5.24 (tested;
    ``past_key_values`` is its deprecated alias until 5.40), ``past_key_values`` in 5.17 (tested),
    where an unknown keyword is silently dropped and the model makes a cache of its own."""
    params = inspect.signature(decoder.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    raise ValueError(f"rollout_engine fast: {type(decoder).__name__}.forward takes no 'cache' or "
                     "'past_key_values'; use rollout_engine=hf")


class HFStep(RowCache):
    """A decode step through HF's own decoder (models TorchDecoder does not cover)."""

    def __init__(self, model):
        self.decoder = model.get_decoder()
        self.keyword = cache_keyword(self.decoder)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """RowCache.step's contract: tokens [n] of rows ``rows`` at positions [n, 1] -> hidden [n, H]."""
        self.follow(rows)
        return self.decoder(input_ids=tokens[:, None], attention_mask=self.mask, position_ids=positions,
                            use_cache=True, **{self.keyword: self.cache}).last_hidden_state[:, -1]  # [n, H]


def _logits(head, h: torch.Tensor) -> torch.Tensor:
    """float32 logits [n, V] of hidden states h [n, H] through the output product ``head``."""
    return head(h).float()


def _stepper(model, *, plan: KernelPlan | None, use_native: bool):
    """The decode step for ``model``: NativeDecoder (C small ops) where TorchDecoder covers the
    model (``plan`` is not None) and the C file builds, TorchDecoder (PyTorch small ops) where only the
    former holds, HF's decoder elsewhere; the products as ``plan`` says (the panel product only beside
    the C ops)."""
    if plan is None:
        return HFStep(model)
    lib = native.library() if use_native else None
    linears = {r: plan.factory(r) for r in ("qkv", "o", "gate_up", "down")
               if lib is not None or not needs_native(plan.products[r])}
    if lib is None:
        return TorchDecoder(model, linears=linears)
    return native.NativeDecoder(model, lib, linears=linears)


def _head(model, plan: KernelPlan | None, use_native: bool):
    """The output layer's product: the plan's, on the layer's weight (its module's own forward where
    HF's decoder steps)."""
    head = model.get_output_embeddings()
    if plan is None or type(head) is not torch.nn.Linear or (needs_native(plan.products["head"]) and not use_native):
        return head
    return plan.factory("head")(head.weight.detach(), head.bias.detach() if head.bias is not None else None)


def step_products(model, rows: int, kernels: str = "auto", *, use_native: bool = True,
                  dtype: str = "float32") -> tuple[dict, object]:
    """The four layer products (role -> factory, for TorchDecoder's ``linears``) and the output
    layer's product of a step of about ``rows`` rows, as ``kernels`` and the measured plan say: what a
    decoder of one's own (grpo.rollout.paged) builds its step from. ``dtype``: tuning.PRECISIONS."""
    base = base_model(model)
    plan = kernel_plan(base, rows, kernels, dtype=dtype)
    linears = {r: plan.factory(r) for r in ("qkv", "o", "gate_up", "down")
               if use_native or not needs_native(plan.products[r])}
    return linears, _head(base, plan, use_native)


@torch.no_grad()
def fast_rollout(model, tokenizer, prompts: list[str], *, group_size: int, max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0,
                 repetition_penalty: float = 1.0, greedy: bool = False,
                 max_prompt_length: int = 1024, with_logprobs: bool = True, keys: list[int] | None = None,
                 synced: bool = False, kernels: str = "auto", use_native: bool = True, stop=None) -> Rollout:
    """``generate_rollout``'s signature and Rollout (engine="fast"); see the module docstring.
    ``kernels``: the ``decode_kernels`` setting (tuning.parse_override: 'auto' measures each product's
    kernel once per machine and shape); the logits equal HF's to fp32 rounding whichever runs (the
    decode step folds the RMSNorm weights into its products). ``use_native``: the C small ops of
    native.py where they build; off, TorchDecoder's PyTorch ops. ``stop``: RolloutEngine.generate's."""
    reason = fast_unsupported_reason(model, synced=synced)
    if reason is not None:
        raise ValueError(f"rollout_engine fast: {reason}")
    start = time.perf_counter()
    enc = encode_for_rollout(model, tokenizer, prompts, group_size=group_size, max_prompt_length=max_prompt_length,
                             keys=keys)
    ids, pmask, eos, g = enc.ids, enc.mask, enc.eos, group_size  # [B, P] each
    sampler = None if greedy else KeyedSampler([], ids.shape[1], temperature=temperature, top_p=top_p, top_k=top_k,
                                               min_p=min_p, repetition_penalty=repetition_penalty)
    was_training = model.training
    model.eval()
    try:
        out = decode_ids(model, ids, pmask, g=g, max_new_tokens=max_new_tokens, eos=eos, sampler=sampler, keys=keys,
                         with_logprobs=with_logprobs and not greedy, temperature=temperature,
                         pad_id=tokenizer.pad_token_id, kernels=kernels, use_native=use_native,
                         stop_rows=None if stop is None else row_stopper(stop))
    finally:
        model.train(was_training)
    return finish_rollout(tokenizer, *enc.rows(), out["ids"], eos, sampling_logp=out["logp"], engine="fast",
                          seconds=time.perf_counter() - start, prompts_truncated=enc.cut)


class FastEngine(RolloutEngine):
    """Our decode loop (``fast_rollout``) for the decoder-only architectures it was checked against;
    refuses other models, and synced generation, when built."""

    name = "fast"
    same_tokens_for_keys = True
    returns_sampling_logprobs = True
    supports_stop = True

    def __init__(self, model, tokenizer, *, synced: bool = False, kernels: str = "auto", options=None):
        reason = fast_unsupported_reason(model, synced=synced)
        if reason is not None:
            raise ValueError(f"rollout_engine fast: {reason}")
        super().__init__(model, tokenizer, synced=synced, kernels=kernels, options=options)

    def _generate(self, prompts: list[str], *, group_size: int, sampling: SamplingSettings, keys: list[int] | None,
                  with_logprobs: bool, greedy: bool, stop=None) -> Rollout:
        return fast_rollout(self.model, self.tokenizer, prompts, group_size=group_size, greedy=greedy,
                            with_logprobs=with_logprobs, keys=keys, synced=self.synced, kernels=self.kernels,
                            stop=stop, **sampling.as_kwargs())


ROLLOUT_ENGINES.register(FastEngine)


@dataclass
class DecodeParts:
    """A model's decode step and output product for one kernel plan, built once (the RMSNorm weights
    folded and every weight packed: a copy of the model's weights) and reusable by later decodes
    while the weights stay as they were (serving; a trainer's weights change every step)."""

    stepper: object
    head: object
    products: tuple  # the plan's (role, product) pairs: parts with the same products are the same


def decode_parts(model, rows: int, capacity: int, *, kernels: str = "auto", use_native: bool = True) -> DecodeParts | None:
    """The parts ``decode_ids`` builds for ``rows`` rows and ``capacity`` positions; None where our
    decode step does not cover the model (decode_ids then steps through HF's decoder)."""
    base = base_model(model)
    if decoder_unsupported_reason(base, capacity) is not None:
        return None
    plan = kernel_plan(base, rows, kernels)
    return DecodeParts(_stepper(base, plan=plan, use_native=use_native), _head(base, plan, use_native),
                       tuple(sorted(plan.products.items())))


def decode_ids(model, ids: torch.Tensor, pmask: torch.Tensor, *, g: int, max_new_tokens: int, eos: list[int],
               kernels: str = "auto", use_native: bool = True, clock: list[float] | None = None,
               parts: DecodeParts | None = None, **kw) -> dict:
    """Token-level fast decoding of left-padded prompt ids [B, P] (``_decode``'s result), on a model or
    a LoRA wrapper (the base model runs, adapters merged into the packed weights). ``clock``: the
    time after each decode step is appended (the backend probe in grpo.rollout.choice). ``parts``:
    a decode_parts result made earlier for this model (its weights unchanged since), instead of
    folding and packing the weights again (about 0.4 s for a 135M model on a 2-core CPU)."""
    base = base_model(model)  # under a LoRA wrapper
    if parts is not None:
        return _decode(base, ids, pmask, g=g, max_new_tokens=max_new_tokens, eos=eos, stepper=parts.stepper,
                       head=parts.head, clock=clock, **kw)
    own_step = decoder_unsupported_reason(base, ids.shape[1] + max_new_tokens) is None
    plan = kernel_plan(base, ids.shape[0] * g, kernels) if own_step else None
    stepper = _stepper(base, plan=plan, use_native=use_native)
    # HF's decoder (models our decode steps do not cover) runs with its plain linears packed for oneDNN
    # unless the setting says MKL
    hf_packed = plan is None and onednn_available() and parse_override(kernels).get("head") != "mkl"
    with packed_linears(base, enabled=hf_packed):
        return _decode(base, ids, pmask, g=g, max_new_tokens=max_new_tokens, eos=eos, stepper=stepper,
                       head=_head(base, plan, use_native), clock=clock, **kw)


def _decode(model, ids: torch.Tensor, pmask: torch.Tensor, *, g: int, max_new_tokens: int, eos: list[int],
            sampler: KeyedSampler | None, keys: list[int] | None, with_logprobs: bool, temperature: float,
            pad_id: int | None, stepper, head, clock: list[float] | None = None, stop_rows=None) -> dict:
    """Prefill the B prompts once, hand their cache to ``stepper`` (which shares it with the G rows of
    each prompt), decode until every row ended. ``stop_rows(t, scores [n, V], tokens [n], live [n])``,
    when given, is asked after each step which live rows end there besides those that emitted EOS
    (bool [n]; serving's per-row caps, deadlines and early stops).

    ids, pmask: [B, P] left-padded. Returns {"ids": [N, T] (pad after a row ended), "logp": [N, T] or
    None}, T = the steps run (the longest completion), as ``generate`` pads them.
    """
    device = ids.device
    n_rows = ids.shape[0] * g
    padded = bool((pmask == 0).any())
    pos = (pmask.long().cumsum(-1) - 1).masked_fill(pmask == 0, 0)  # [B, P] as generate numbers them
    cache = _buffer_cache(model, ids.shape[1] + max_new_tokens)
    decoder = model.get_decoder()
    out = decoder(input_ids=ids, attention_mask=pmask if padded else None, position_ids=pos, use_cache=True,
                  **{cache_keyword(decoder): cache})
    if cache.get_seq_length() != ids.shape[1]:  # the decoder made a cache of its own: ours saw nothing
        raise RuntimeError(f"rollout_engine fast: the prefill filled {cache.get_seq_length()} of {ids.shape[1]} "
                           f"cache positions ({type(decoder).__name__} ignored the cache it was given); "
                           "use rollout_engine=hf")
    stepper.start(cache, pmask, g, max_new_tokens)
    scores = _logits(head, out.last_hidden_state[:, -1]).repeat_interleave(g, 0)  # [N, V]
    live = torch.arange(n_rows, device=device)  # [n] global row of each live row
    next_pos = pos[:, -1:].repeat_interleave(g, 0) + 1  # [n, 1]
    eos_t = torch.tensor(eos, device=device)
    fill = 0 if pad_id is None else pad_id
    tokens = torch.full((n_rows, max_new_tokens), fill, dtype=torch.long, device=device)  # [N, Tmax]
    logps = torch.zeros(n_rows, max_new_tokens, device=device) if with_logprobs else None  # [N, Tmax]
    live_keys = keys
    # the rows' context tokens, for the repetition penalty: [N, V]
    seen = core.seen_tokens(ids.repeat_interleave(g, 0), pmask.repeat_interleave(g, 0), scores.shape[-1]) \
        if sampler is not None and sampler.penalized else None
    t = 0
    while t < max_new_tokens:
        mine = seen[live] if seen is not None else None  # [n, V]
        tok = _pick(scores, sampler, t, live_keys, mine)  # [n]
        tokens[live, t] = tok
        if logps is not None:  # log q of the drawn token (core.sampling: the distribution it was drawn from)
            logps[live, t] = core.processed_logprobs(scores, tok, seen=mine, **sampler.settings)
        if seen is not None:
            seen[live, tok] = True
        t += 1
        ended = torch.isin(tok, eos_t)  # [n]
        if stop_rows is not None:
            ended = ended | stop_rows(t, scores, tok, live)  # [n]
        if t == max_new_tokens or bool(ended.all()):
            break
        if bool(ended.any()):  # the rows that ended leave the batch (the stepper drops their cache rows)
            keep = (~ended).nonzero()[:, 0]  # [n']
            live, tok, next_pos = live[keep], tok[keep], next_pos[keep]
            live_keys = [live_keys[i] for i in keep.tolist()] if live_keys is not None else None
        scores = _logits(head, stepper.step(tok, next_pos, live))  # [n, V]
        next_pos = next_pos + 1
        if clock is not None:
            clock.append(time.perf_counter())
    return {"ids": tokens[:, :t], "logp": logps[:, :t] if logps is not None else None}
