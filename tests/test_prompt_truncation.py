"""Prompts longer than max_prompt_length keep their end (the chat template's generation prompt) on
both rollout backends, in evaluation and in training, and each cut is counted."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo.data import render_prompt
from grpo.errors import ConfigError
from grpo.eval.evaluate import EvalSettings, evaluate
from grpo.rollout import SamplingSettings, fast_rollout, generate_rollout, make_engine
from grpo.rollout.types import encode_prompts
from grpo.train.trainer import Trainer

from tests.test_trainer import make_cfg

LIMIT = 24
GENERATION_PROMPT = "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    # the opposite of what the rollout needs: the result must not depend on these, nor change them
    tok.padding_side, tok.truncation_side = "right", "right"
    return model, tok


def _prompts(tok) -> list[str]:
    long_q = "What is " + " + ".join(["1"] * 30) + "?"  # far over LIMIT tokens
    return [render_prompt(tok, q, "") for q in (long_q, "1+1?", long_q + " again")]


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def test_encode_keeps_each_prompts_last_tokens_and_counts_the_cut(tiny):
    _, tok = tiny
    prompts = _prompts(tok)
    ids, mask, n_cut = encode_prompts(tok, prompts, LIMIT)
    full = [_ids(tok, p) for p in prompts]
    assert n_cut == sum(len(f) > LIMIT for f in full) == 2
    assert ids.shape == mask.shape == (3, LIMIT)
    tail = _ids(tok, GENERATION_PROMPT)
    for row, m, f in zip(ids, mask, full):
        kept = row[m.bool()].tolist()
        assert kept == f[-LIMIT:]  # the end, not the start
        assert kept[-len(tail):] == tail
        assert m.tolist() == sorted(m.tolist())  # left-padded: padding only before the tokens
    assert (tok.padding_side, tok.truncation_side) == ("right", "right")


@pytest.mark.parametrize("backend", [generate_rollout, fast_rollout], ids=["hf", "fast"])
def test_both_backends_sample_from_the_kept_end(tiny, backend):
    """The model sees the kept end: greedy completions of the long prompts equal those of the same
    prompts cut by hand to their last LIMIT tokens (which need no cut)."""
    model, tok = tiny
    prompts = _prompts(tok)
    ro = backend(model, tok, prompts, group_size=2, max_new_tokens=5, greedy=True, max_prompt_length=LIMIT)
    assert ro.prompts_truncated == 2
    pre_cut = [tok.decode(_ids(tok, p)[-LIMIT:]) for p in prompts]
    assert [_ids(tok, p) for p in pre_cut] == [_ids(tok, p)[-LIMIT:] for p in prompts]  # a lossless round trip
    ref = backend(model, tok, pre_cut, group_size=2, max_new_tokens=5, greedy=True, max_prompt_length=LIMIT)
    assert ref.prompts_truncated == 0
    assert torch.equal(ro.prompt_ids, ref.prompt_ids) and ro.texts == ref.texts
    tail = _ids(tok, GENERATION_PROMPT)
    assert all(row[-len(tail):].tolist() == tail for row in ro.prompt_ids)


def test_evaluation_counts_the_prompts_it_cut(tiny):
    model, tok = tiny
    long_q = "What is " + " + ".join(["1"] * 30) + "?"
    samples = [{"prompt": long_q, "answer": "30"}, {"prompt": "1+1?", "answer": "2"},
               {"prompt": long_q, "answer": "30"}]

    def verifier(completion, sample):
        return 0.0

    for max_len, expected in ((LIMIT, 2), (4096, 0)):
        settings = EvalSettings(system_prompt="", batch_size=2, pass_k=0, pass_prompts=0, verifier_name="verifier",
                                sampling=SamplingSettings(max_new_tokens=3, max_prompt_length=max_len, temperature=1.0))
        res = evaluate(make_engine("hf", model, tok), samples, verifier, settings)
        assert res["prompts_truncated"] == expected


def test_a_system_prompt_that_leaves_no_room_is_refused_at_start_up(tmp_path, tiny_model_dir, tiny_dataset):
    """A system prompt over the limit cannot be kept with its question (cut from the left it would be lost):
    refused before the first step, naming the key (cutting and counting: tests/test_prompt_fit.py)."""
    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, eval_prompts=0, max_steps=2,
                   system_prompt="Think step by step. " * 4, max_prompt_length=LIMIT)
    with pytest.raises(ConfigError, match=rf"^max_prompt_length: {LIMIT} tokens cannot hold the system message"):
        Trainer(cfg)
