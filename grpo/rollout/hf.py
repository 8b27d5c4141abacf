"""Sampling with Hugging Face ``generate``: works for any causal LM transformers supports."""

from __future__ import annotations

import time

import torch

from grpo import core
from grpo.rollout.types import Rollout, encode_for_rollout, finish_rollout
from grpo.rollout.engine import ROLLOUT_ENGINES, RolloutEngine, SamplingSettings
from grpo.rollout.keys import KeyedSampler


# what a model's own generation_config may ship (Qwen2.5-Instruct: repetition_penalty 1.05) and generate would
# apply beside grpo's processor: the engines draw from the run's q alone (core.sampling)
NOT_THE_MODELS = dict(repetition_penalty=None, min_p=None, typical_p=None, epsilon_cutoff=None, eta_cutoff=None,
                      no_repeat_ngram_size=None, encoder_repetition_penalty=None, top_h=None)


class _Stop:
    """``stop(row, new_ids)`` as a transformers stopping criterion (bool [N] per step)."""

    def __init__(self, stop, prompt_len: int):
        self.stop, self.prompt_len = stop, prompt_len

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        rows = input_ids[:, self.prompt_len:].tolist()
        return torch.tensor([bool(self.stop(i, r)) for i, r in enumerate(rows)], device=input_ids.device)


@torch.no_grad()
def generate_rollout(model, tokenizer, prompts: list[str], *, group_size: int, max_new_tokens: int,
                     temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0,
                     repetition_penalty: float = 1.0, greedy: bool = False,
                     max_prompt_length: int = 1024, with_logprobs: bool = True, keys: list[int] | None = None,
                     synced: bool = False, stop=None) -> Rollout:
    """Sample ``group_size`` completions for each rendered prompt; rows are grouped by prompt.

    ``keys`` (one int per row) switches to ``KeyedSampler``: the same distribution, drawn per row from
    its key. ``synced`` keeps stepping the model until every process has finished (FSDP2: the
    sharded forward is a collective). ``stop``: RolloutEngine.generate's (a stopping criterion).
    """
    start = time.perf_counter()
    keyed = keys is not None and not greedy
    enc = encode_for_rollout(model, tokenizer, prompts, group_size=group_size, max_prompt_length=max_prompt_length,
                             keys=keys if keyed else None)
    prompt_ids, prompt_mask = enc.rows()  # [N, P] each
    eos = enc.eos
    kwargs = dict(max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id,
                  return_dict_in_generate=True, output_logits=with_logprobs and not greedy, synced_gpus=synced,
                  **NOT_THE_MODELS)
    proc = KeyedSampler(keys if keyed else [], prompt_ids.shape[1], temperature=temperature, top_p=top_p, top_k=top_k,
                        min_p=min_p, repetition_penalty=repetition_penalty, prompt_mask=prompt_mask)
    if keyed:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None, logits_processor=[proc])
    elif greedy:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    else:  # generate samples from q's scores (core.processed_scores), which grpo's processor makes
        kwargs.update(do_sample=True, temperature=None, top_p=None, top_k=None, logits_processor=[_Processed(proc)])
    if stop is not None:
        kwargs["stopping_criteria"] = [_Stop(stop, prompt_ids.shape[1])]
    was_training = model.training
    model.eval()
    try:
        out = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, **kwargs)
    finally:  # also when a stop request ends the call (grpo.infra.stop)
        model.train(was_training)
    completion_ids = out.sequences[:, prompt_ids.shape[1]:]  # [N, T]
    sampling_logp = None
    if kwargs["output_logits"]:
        logits = torch.stack(out.logits, dim=1)  # [N, T, V] raw logits of each decoding step
        sampling_logp = _drawn_logprobs(proc, logits, prompt_ids, prompt_mask, completion_ids)  # [N, T]
    return finish_rollout(tokenizer, prompt_ids, prompt_mask, completion_ids, eos, sampling_logp=sampling_logp,
                          engine="hf", seconds=time.perf_counter() - start, prompts_truncated=enc.cut)


class _Processed:
    """q's scores (core.processed_scores) as a logits processor for ``generate(do_sample=True)``."""

    def __init__(self, sampler: KeyedSampler):
        self.sampler = sampler

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        seen = core.seen_tokens(input_ids, self.sampler.real_tokens(input_ids), scores.shape[-1]) \
            if self.sampler.penalized else None
        return self.sampler.process(scores, seen)


def _drawn_logprobs(sampler: KeyedSampler, logits: torch.Tensor, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                    completion_ids: torch.Tensor) -> torch.Tensor:
    """log q [N, T] of each drawn token from the raw logits [N, T, V] (the distribution it was drawn from,
    core.sampling), step by step: the context at step t is the prompt's real tokens and the t before it."""
    n, t_len, vocab = logits.shape
    seen = core.seen_tokens(prompt_ids, prompt_mask, vocab) if sampler.penalized else None  # [N, V]
    out = torch.zeros(n, t_len, device=logits.device)  # [N, T]
    for t in range(t_len):
        out[:, t] = core.processed_logprobs(logits[:, t], completion_ids[:, t], seen=seen, **sampler.settings)
        if seen is not None:
            seen[torch.arange(n), completion_ids[:, t]] = True
    return out.nan_to_num(neginf=0.0)  # a padding token after a row's end may fall outside q: it is masked anyway


class HFEngine(RolloutEngine):
    """Sampling with transformers ``generate`` (``generate_rollout``): any causal LM, synced FSDP2
    generation included; keyed rows draw through ``KeyedSampler``."""

    name = "hf"
    same_tokens_for_keys = True
    returns_sampling_logprobs = True
    supports_stop = True

    def _generate(self, prompts: list[str], *, group_size: int, sampling: SamplingSettings, keys: list[int] | None,
                  with_logprobs: bool, greedy: bool, stop=None) -> Rollout:
        return generate_rollout(self.model, self.tokenizer, prompts, group_size=group_size, greedy=greedy,
                                with_logprobs=with_logprobs, keys=keys, synced=self.synced, stop=stop,
                                **sampling.as_kwargs())


ROLLOUT_ENGINES.register(HFEngine)
