"""Sampling with Hugging Face ``generate``: works for any causal LM transformers supports."""

from __future__ import annotations

import time

import torch

from grpo.core import token_logprobs
from grpo.rollout.base import Rollout, completion_mask_from_ids


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
                     max_prompt_length: int = 1024, with_logprobs: bool = True) -> Rollout:
    """Sample ``group_size`` completions for each rendered prompt; rows are grouped by prompt."""
    start = time.perf_counter()
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, truncation=True, max_length=max_prompt_length,
                    add_special_tokens=False)
    device = next(model.parameters()).device
    prompt_ids = enc["input_ids"].to(device).repeat_interleave(group_size, 0)  # [N, P]
    prompt_mask = enc["attention_mask"].to(device).repeat_interleave(group_size, 0)  # [N, P]
    eos = eos_token_ids(model, tokenizer)
    kwargs = dict(max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id,
                  return_dict_in_generate=True, output_logits=with_logprobs and not greedy)
    if greedy:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    else:
        kwargs.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=top_k)
    was_training = model.training
    model.eval()
    out = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, **kwargs)
    model.train(was_training)
    completion_ids = out.sequences[:, prompt_ids.shape[1]:]  # [N, T]
    done = completion_mask_from_ids(completion_ids, eos)
    mask = done["mask"]  # [N, T]
    completion_ids = torch.where(mask.bool(), completion_ids, tokenizer.pad_token_id)  # [N, T]
    sampling_logp = None
    if kwargs["output_logits"]:
        logits = torch.stack(out.logits, dim=1)  # [N, T, V] raw logits of each decoding step
        sampling_logp = token_logprobs(logits, completion_ids, temperature=temperature) * mask  # [N, T]
    texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    return Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
                   completion_mask=mask, truncated=done["truncated"], sampling_logp=sampling_logp, texts=texts,
                   backend="hf", seconds=time.perf_counter() - start)
