"""Sampling with Hugging Face ``generate``: works for any causal LM transformers supports."""

from __future__ import annotations

import time

import torch

from grpo.core import token_logprobs
from grpo.rollout.base import Rollout, finish_rollout


class KeyedSampler:
    """Sampling as a logits processor for greedy ``generate``: temperature, top-k and top-p exactly as
    ``generate`` applies them, then the Gumbel-max trick, argmax(logits + Gumbel noise), which draws
    exactly from softmax(logits) (Gumbel 1954; Maddison et al. 2014).

    The noise of row n at decoding step t comes from its own generator seeded by (keys[n], t), so a
    completion depends on its key alone, not on which other rows share the batch: one process and
    N processes under torchrun (or a different micro-batching) sample the same tokens.
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
        return self.perturb(input_ids, scores, input_ids.shape[1] - self.prompt_len, self.keys)

    def perturb(self, input_ids: torch.Tensor, scores: torch.Tensor, t: int, keys: list[int]) -> torch.Tensor:
        """Warped scores [n, V] plus the Gumbel noise of rows ``keys`` at decoding step ``t``; argmax
        of the result is the sampled token (also used by the fast backend on its live rows)."""
        for w in self.warpers:
            scores = w(input_ids, scores)  # [n, V]
        u = torch.empty_like(scores, dtype=torch.float32)  # [n, V]
        gen = torch.Generator(device=scores.device)
        for n, key in enumerate(keys):
            gen.manual_seed((key * 1_000_003 + t) % 2**63)
            u[n] = torch.rand(scores.shape[1], generator=gen, device=scores.device)
        gumbel = -torch.log(-torch.log(u.clamp(1e-20, 1.0 - 1e-7)))  # [N, V]
        return scores.float() + gumbel


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
