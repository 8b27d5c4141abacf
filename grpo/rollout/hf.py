"""Sampling with Hugging Face ``generate``: works for any causal LM transformers supports."""

from __future__ import annotations

import time

import torch

from grpo.core import token_logprobs
from grpo.rollout.base import Rollout, finish_rollout


def keyed_uniform(key: int, t: int) -> float:
    """A uniform number in [0, 1) fixed by (key, t): splitmix64 of the pair (Steele et al. 2014), the
    top 53 bits as a float. Plain integer arithmetic, so every process and platform agrees."""
    z = (key * 1_000_003 + t + 0x9E3779B97F4A7C15) % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return ((z ^ (z >> 31)) >> 11) * 2.0**-53


class KeyedSampler:
    """Sampling as a logits processor for greedy ``generate``: temperature, top-k and top-p exactly as
    ``generate`` applies them, then one draw from softmax(warped logits) by inverting its cumulative
    distribution at a uniform number, which draws exactly from that softmax.

    The uniform number of row n at decoding step t is fixed by (keys[n], t), so a completion depends
    on its key alone, not on which other rows share the batch: one process and N processes under
    torchrun (or a different micro-batching) sample the same tokens. One number per row and step:
    Gumbel-max over the vocabulary (the earlier method) needed V random numbers and two logarithms
    each, ~3.7 ms of a 50 ms decode step at batch 8 on SmolLM2 (V = 49,152) against ~0.6 ms here.
    """

    def __init__(self, keys: list[int], prompt_len: int, *, temperature: float, top_p: float, top_k: int):
        from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                            TopPLogitsWarper)

        self.keys, self.prompt_len = keys, prompt_len
        self.warpers = [TemperatureLogitsWarper(temperature)] if temperature != 1.0 else []
        if top_k:
            self.warpers.append(TopKLogitsWarper(top_k))
        if top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p))

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """Scores for greedy ``generate``: 0 at the drawn token of each row, -inf elsewhere."""
        tokens = self.draw(scores, input_ids.shape[1] - self.prompt_len, self.keys)  # [n]
        return torch.full_like(scores, float("-inf")).scatter_(1, tokens[:, None], 0.0)  # [n, V]

    def draw(self, scores: torch.Tensor, t: int, keys: list[int]) -> torch.Tensor:
        """The sampled token [n] of rows ``keys`` at decoding step ``t`` from their scores [n, V] (also
        used by the fast backend on its live rows)."""
        for w in self.warpers:
            scores = w(None, scores)  # [n, V]
        cdf = torch.softmax(scores.float(), -1).double().cumsum_(-1)  # [n, V], float64: no drift over V
        total = cdf[:, -1:].contiguous()  # [n, 1]
        u = torch.tensor([keyed_uniform(k, t) for k in keys], dtype=torch.float64, device=scores.device)
        drawn = torch.searchsorted(cdf, u[:, None] * total, right=True)  # [n, 1] first cdf above u
        # u * total can round up to total: the last token of positive probability is then the draw
        # (tokens that top-k / top-p removed have probability 0 and are never the first above u)
        last = torch.searchsorted(cdf, total, right=False)  # [n, 1]
        return torch.minimum(drawn, last)[:, 0]  # [n]


def row_keys(seed: int, step: int, first_row: int, count: int) -> list[int]:
    """Sampling keys of global rows first_row .. first_row + count - 1 at a training step."""
    base = (seed % 2**20) * 2**42 + (step % 2**22) * 2**20
    return [base + first_row + i for i in range(count)]


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every token that ends a completion: the generation config's EOS ids and the tokenizer's."""
    ids = model.generation_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


@torch.no_grad()
def generate_rollout(model, tokenizer, prompts: list[str], *, group_size: int, max_new_tokens: int,
                     temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, greedy: bool = False,
                     max_prompt_length: int = 1024, with_logprobs: bool = True, keys: list[int] | None = None,
                     synced: bool = False) -> Rollout:
    """Sample ``group_size`` completions for each rendered prompt; rows are grouped by prompt.

    ``keys`` (one int per row) switches to ``KeyedSampler``: the same distribution, drawn per row from
    its key. ``synced`` keeps stepping the model until every process has finished (FSDP2: the
    sharded forward is a collective).
    """
    start = time.perf_counter()
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, truncation=True, max_length=max_prompt_length,
                    add_special_tokens=False)
    device = next(model.parameters()).device
    prompt_ids = enc["input_ids"].to(device).repeat_interleave(group_size, 0)  # [N, P]
    prompt_mask = enc["attention_mask"].to(device).repeat_interleave(group_size, 0)  # [N, P]
    eos = eos_token_ids(model, tokenizer)
    kwargs = dict(max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id,
                  return_dict_in_generate=True, output_logits=with_logprobs and not greedy, synced_gpus=synced)
    if keys is not None and not greedy:
        if len(keys) != prompt_ids.shape[0]:
            raise ValueError(f"keys: {len(keys)} given for {prompt_ids.shape[0]} rows")
        proc = KeyedSampler(keys, prompt_ids.shape[1], temperature=temperature, top_p=top_p, top_k=top_k)
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None, logits_processor=[proc])
    elif greedy:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    else:
        kwargs.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=top_k)
    was_training = model.training
    model.eval()
    out = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, **kwargs)
    model.train(was_training)
    completion_ids = out.sequences[:, prompt_ids.shape[1]:]  # [N, T]
    sampling_logp = None
    if kwargs["output_logits"]:
        logits = torch.stack(out.logits, dim=1)  # [N, T, V] raw logits of each decoding step
        sampling_logp = token_logprobs(logits, completion_ids, temperature=temperature)  # [N, T]
    return finish_rollout(tokenizer, prompt_ids, prompt_mask, completion_ids, eos, sampling_logp=sampling_logp,
                          backend="hf", seconds=time.perf_counter() - start)
