"""The serving scheme's task-appropriate completeness check (a stated final answer) and its default
from a run's rewards (a run folder's, an exported folder's)."""

from __future__ import annotations

import argparse

import pytest

from grpo.errors import ConfigError
from grpo.rewards.builtin import stated_answer_reward
from grpo.serve.engines import Generation
from grpo.serve.scheme import Scheme, default_completeness, incomplete_reason
from grpo.serve.server import completeness_of

FINAL = [  # (answer, how it ended, the check's verdict)
    ("7 + 5 = 12", "stop", None),
    ("7 + 5 = 12.", "entropy", None),
    ("To add 7 and 5, you add them: 7 + 5 = 12.", "stop", None),
    ("The answer is 12", "stop", None),
    ("The sum is 12.", "stop", None),
    ("\\boxed{12}", "stop", None),
    ("12", "stop", None),
    ("7 + 5", "stop", "no_final_answer"),  # the sum, never its result
    ("8 + 1 = 1 + 2", "stop", "no_final_answer"),  # an equation with no result (the default run, numeric alone)
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


@pytest.mark.parametrize("text,finish,want", [f for f in FINAL if f[1] == "stop"])
def test_the_check_and_the_stated_answer_reward_apply_one_rule(text, finish, want):
    """What the default run is rewarded for stating is what serving accepts as stated."""
    sample = {"prompt": "What is 7 + 5?", "answer": "12"}
    assert (stated_answer_reward(text, sample) > 0) == (want != "no_final_answer")


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
    assert completeness_of(args(), "numeric,stated_answer") == "final_answer"  # the default run
    assert completeness_of(args(), None) == "markers"  # a plain model: the seed's concluding words
    assert completeness_of(args(closing_markers=["en=done"]), "numeric") == "markers"
    assert completeness_of(args(verifier="format"), "numeric") == "verifier"
    assert completeness_of(args(completeness="markers"), "numeric") == "markers"
    with pytest.raises(ConfigError, match="valid: auto, markers, final_answer, verifier"):
        completeness_of(args(completeness="vibes"), "numeric")
    with pytest.raises(ConfigError, match="--verifier"):
        completeness_of(args(completeness="verifier"), None)


def _raises(completion: str, sample: dict) -> float:
    raise RuntimeError("the verifier broke")


def test_a_raising_verifier_rejects_the_answer_and_the_fallback_answers():
    """--completeness verifier with a reward that raises: the answer is not accepted ("verifier_error"),
    so the fallback answers; one that scores 0 rejects it, one that scores above 0 accepts it."""
    gen = Generation("7 + 5 = 12", 6, "stop", 0.0)
    sample = {"prompt": "What is 7 + 5?", "answer": None}
    assert incomplete_reason(gen, sample, Scheme(completeness="verifier", verifier=_raises)) == "verifier_error"
    assert incomplete_reason(gen, sample, Scheme(completeness="verifier", verifier=lambda c, s: 0.0)) == \
        "verifier_rejected"
    assert incomplete_reason(gen, sample, Scheme(completeness="verifier", verifier=lambda c, s: 1.0)) is None


def test_the_fallbacks_note_is_in_the_answers_language():
    from grpo.serve.scheme import DEFAULT_NOTES, Router

    router = Router(None, None, Scheme())
    assert router.note("因此，答案是 12。") == DEFAULT_NOTES["zh"] == "本回答由基础模型生成，未经强化学习优化。"
    assert router.note("So the answer is 12.") == DEFAULT_NOTES["en"]
    assert Router(None, None, Scheme(), noted=False).note("因此，答案是 12。") == ""  # the model is its own fallback
