"""The serving scheme's task-appropriate completeness check (a stated final answer) and its default
from a run's rewards, the fast engine's kept decode parts (the same tokens as parts built per batch),
and the fallback yielding the cores to the GRPO model only while a GRPO deadline can still be met."""

from __future__ import annotations

import argparse
import time

import pytest
import torch

from grpo.errors import ConfigError
from grpo.rollout.base import encode_prompts
from grpo.rollout.fast import decode_ids
from grpo.serve.batcher import Batcher
from grpo.serve.engines import FastServeEngine, Generation, HFServeEngine
from grpo.serve.scheme import Scheme, default_completeness, incomplete_reason
from grpo.serve.server import completeness_of
from tests.conftest import TEST_SEED, build_tiny_model, build_tokenizer
from tests.test_serve import Scripted

FINAL = [  # (answer, how it ended, the check's verdict)
    ("7 + 5 = 12", "stop", None),
    ("7 + 5 = 12.", "entropy", None),
    ("To add 7 and 5, you add them: 7 + 5 = 12.", "stop", None),
    ("The answer is 12", "stop", None),
    ("The sum is 12.", "stop", None),
    ("\\boxed{12}", "stop", None),
    ("12", "stop", None),
    ("7 + 5", "stop", "no_final_answer"),  # the sum, never its result
    ("The sum is 12 or 13.", "stop", "no_final_answer"),  # hedged
    ("Let me think about it", "stop", "no_final_answer"),
    ("7 + 5 = 1", "entropy", "early_stop"),  # an early stop inside '12'
    ("7 + 5 = 12", "length", "token_cap"),
    ("", "deadline", "deadline"),
]


@pytest.mark.parametrize("text,finish,want", FINAL)
def test_final_answer_check(text, finish, want):
    scheme = Scheme(completeness="final_answer")
    assert incomplete_reason(Generation(text, 4, finish, 0.0), {"prompt": "What is 7 + 5?", "answer": None},
                             scheme) == want


def test_the_default_arithmetic_answer_passes_the_run_derived_check_and_not_the_markers():
    gen = Generation("7 + 5 = 12.", 8, "stop", 0.0)
    sample = {"prompt": "What is 7 + 5?", "answer": None}
    assert incomplete_reason(gen, sample, Scheme(completeness=default_completeness("numeric"))) is None
    assert incomplete_reason(gen, sample, Scheme(completeness="markers")) == "no_closing_marker"


def test_completeness_default_follows_the_run_and_the_flags():
    def args(**kw):
        base = dict(completeness="auto", verifier=None, closing_markers=None)
        return argparse.Namespace(**{**base, **kw})

    assert default_completeness("numeric") == default_completeness("format,length") == "final_answer"
    assert default_completeness("code") == default_completeness(None) == "markers"
    assert completeness_of(args(), "numeric") == "final_answer"  # the default run (rewards=numeric)
    assert completeness_of(args(), None) == "markers"  # a plain model: the seed's concluding words
    assert completeness_of(args(closing_markers=["en=done"]), "numeric") == "markers"
    assert completeness_of(args(verifier="format"), "numeric") == "verifier"
    assert completeness_of(args(completeness="markers"), "numeric") == "markers"
    with pytest.raises(ConfigError, match="valid: auto, markers, final_answer, verifier"):
        completeness_of(args(completeness="vibes"), "numeric")
    with pytest.raises(ConfigError, match="--verifier"):
        completeness_of(args(completeness="verifier"), None)


def _tiny():
    tok = build_tokenizer()
    model = build_tiny_model(len(tok), seed=TEST_SEED, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    return tok, model


def test_kept_decode_parts_give_the_tokens_of_parts_built_per_batch():
    tok, model = _tiny()
    engine = FastServeEngine(model, tok, kernels="mkl")
    prompts = ["What is 2 + 3?", "hi", "Once upon a time"]
    ids, mask, _ = encode_prompts(tok, prompts, max_length=10**9)
    kw = dict(g=1, max_new_tokens=12, eos=[], sampler=None, keys=None, with_logprobs=False, temperature=1.0,
              pad_id=tok.pad_token_id, kernels="mkl")
    fresh = decode_ids(model, ids, mask, **kw)["ids"]
    parts = engine.parts(3, ids.shape[1] + 12)
    assert parts is not None and engine.parts(3, ids.shape[1] + 12) is parts  # built once, kept
    for _ in range(2):  # a second decode on the same parts: they were reset, not reused dirty
        assert torch.equal(decode_ids(model, ids, mask, parts=parts, **kw)["ids"], fresh)


def test_fallback_yields_to_the_grpo_model_until_its_deadline_then_goes_on():
    tok, plain = _tiny()
    scripted = Scripted(plain.config)
    scripted.load_state_dict(plain.state_dict())
    scripted.script(prefill_delay=30.0)
    grpo = Batcher(HFServeEngine(scripted, tok), window_s=0.0)
    fallback = Batcher(FastServeEngine(plain, tok, kernels="mkl"), window_s=0.0, yield_to=grpo)
    free = Batcher(FastServeEngine(plain, tok, kernels="mkl"), window_s=0.0)
    try:
        assert free.submit("warm", cap=2, deadline=None).result(timeout=30).tokens == 2
        deadline = time.monotonic() + 1.0
        slow = grpo.submit("a slow GRPO prefill", cap=4, deadline=deadline)
        while grpo.busy_until() is None:
            time.sleep(0.005)
        alone = free.submit("Once upon a time", cap=6, deadline=None).result(timeout=30)
        assert alone.tokens == 6 and time.monotonic() < deadline  # without the yield it ends at once
        yielded = fallback.submit("Once upon a time", cap=6, deadline=None)
        time.sleep(0.3)
        assert not yielded.done()  # paused after its first token while the GRPO request can make its deadline
        got = yielded.result(timeout=30)  # past the deadline it goes on, though the GRPO prefill still runs
        assert time.monotonic() >= deadline and not slow.done() and got.text == alone.text
    finally:
        scripted.release.set()
        for b in (grpo, fallback, free):
            b.stop()
