"""pass@k against brute-force enumeration; evaluation output shape."""

import itertools

import pytest

from grpo.eval.evaluate import EvalSettings, pass_at_k
from grpo.rollout import SamplingSettings


def _settings(*, max_new_tokens: int, **kw) -> EvalSettings:
    """Evaluation settings with no system prompt, the default warpers and ``max_new_tokens``."""
    sampling = SamplingSettings(max_new_tokens=max_new_tokens, temperature=1.0, max_prompt_length=1024)
    return EvalSettings(system_prompt="", sampling=sampling, **{"batch_size": 64, "pass_k": 0, "pass_prompts": 0,
                                                                "verifier_name": "verifier", **kw})


@pytest.mark.parametrize("n, c, k", [(4, 0, 1), (4, 1, 1), (4, 1, 2), (5, 2, 3), (6, 6, 4), (8, 3, 8)])
def test_pass_at_k_equals_enumeration(n, c, k):
    # probability that a random k-subset of n samples (c correct) holds at least one correct one
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    expected = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_rejects_k_above_n():
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_pass_at_k_samples_only_the_pass_prompts(tiny_model_dir):
    """pass@k generates k completions for each of the first pass_prompts prompts, no more: a batched
    verifier sees exactly as many completions as samples (2 prompts x k = 2 -> 4 per call)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo.eval.evaluate import evaluate
    from grpo.rollout import make_engine

    calls = []

    def verifier(completions, samples):
        calls.append((len(completions), len(samples)))
        return [0.0] * len(completions)

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    samples = [{"prompt": f"What is {a} + 1?", "answer": str(a + 1)} for a in range(4)]
    out = evaluate(make_engine("hf", model, tok), samples, verifier,
                   _settings(max_new_tokens=3, batch_size=64, pass_k=2, pass_prompts=2))
    assert calls == [(4, 4), (4, 4)]  # greedy on 4 prompts, then 2 prompts x 2 samples
    assert out["pass_prompts"] == 2 and out["pass@k"] == 0.0


def _tiny_engine(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo.rollout import make_engine

    return make_engine("hf", AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                       AutoTokenizer.from_pretrained(tiny_model_dir))


def test_an_interrupt_ends_the_running_batch_at_its_next_token(tiny_model_dir):
    """A stop request that arrives while a batch is being generated ends every row at the next token
    (the engine's ``stop`` hook asks ``Interrupt.requested`` after each token), not after the batch's
    max_new_tokens; that cut batch is dropped, no further batch starts, and the result is marked
    interrupted with the count it scored (0 here)."""
    from grpo.eval.evaluate import Interrupt, evaluate

    engine = _tiny_engine(tiny_model_dir)
    widths, generate = [], engine.generate

    def recorded(*args, **kw):  # the real engine; its rollout's width is the tokens it generated
        ro = generate(*args, **kw)
        widths.append(ro.completion_ids.shape[1])
        return ro

    engine.generate = recorded
    asked = {"n": 0}

    def requested() -> bool:  # true from the 3rd token of the first batch on (8 rows ask once per token)
        asked["n"] += 1
        return asked["n"] > 8 * 2

    samples = [{"prompt": f"What is {a} + 1?", "answer": str(a + 1)} for a in range(16)]
    out = evaluate(engine, samples, lambda c, s: 1.0, _settings(max_new_tokens=40, batch_size=8, pass_k=2, pass_prompts=4),
                   interrupt=Interrupt(requested=requested))
    assert len(widths) == 1 and widths[0] <= 3 < 40, widths
    assert out["interrupted"] is True and out["prompts_scored"] == 0 and out["n_prompts"] == 16
    assert out["pass@k"] is None and out["pass_prompts"] == 0


def test_an_interrupt_between_batches_keeps_what_was_scored(tiny_model_dir):
    """A stop request seen between batches (here: raised by the verifier of the first batch) keeps the
    first batch's scores: accuracy over the prompts scored, their count, the mark."""
    from grpo.eval.evaluate import Interrupt, evaluate

    flag: list[bool] = []

    def verifier(completion, sample):
        flag.append(True)
        return float(sample["answer"] == "1")

    samples = [{"prompt": f"What is {a} + 1?", "answer": str(a + 1)} for a in range(6)]
    out = evaluate(_tiny_engine(tiny_model_dir), samples, verifier, _settings(max_new_tokens=4, batch_size=4),
                   interrupt=Interrupt(requested=lambda: bool(flag)))
    assert out["interrupted"] is True and out["prompts_scored"] == 4 and out["accuracy"] == 0.25  # "1" of 1..4
    assert len(flag) == 4  # the second batch was never generated or verified


def test_a_verifier_that_cannot_score_is_reported_or_stops_the_evaluation(tiny_model_dir):
    """Completions the verifier cannot score count as wrong and are reported (verifier_failures); once
    they reach max_failure_share of those so far, RewardError names the verifier and its exception,
    instead of an accuracy of 0 that looks measured."""
    from grpo.errors import RewardError
    from grpo.eval.evaluate import evaluate

    engine = _tiny_engine(tiny_model_dir)
    samples = [{"prompt": f"What is {a} + 1?", "answer": str(a + 1)} for a in range(4)]
    calls = {"n": 0}

    def every_other(completion, sample):
        calls["n"] += 1
        if calls["n"] % 2 == 0:
            raise KeyError("tests")
        return 1.0

    out = evaluate(engine, samples, every_other, _settings(max_new_tokens=3, batch_size=4))
    assert out["verifier_failures"] == 2 and out["prompts_scored"] == 4 and out["accuracy"] == 0.5
    assert "interrupted" not in out
    with pytest.raises(RewardError, match=r"^evaluation: the verifier \(reward 'v'\) could not score 2 of the 4 greedy "
                                          r"completions so far \(max_reward_failure_share=0\.5\): KeyError: 'tests'$"):
        evaluate(engine, samples, every_other,
                 _settings(max_new_tokens=3, batch_size=4, verifier_name="v", max_failure_share=0.5))
    # a wrong shape is the reward's bug, not a completion it cannot score: it stops at the first call
    from grpo.rewards.forms import RewardShapeError
    with pytest.raises(RewardShapeError, match=r"^rewards: 'v' returned a list \(1 values\) for one completion"):
        evaluate(engine, samples, lambda c, s: [1.0], _settings(max_new_tokens=3, batch_size=4, verifier_name="v"))


def test_a_stop_signal_inside_a_generate_call_ends_it_at_once(tiny_model_dir):
    """Inside the interrupt's abortable region (grpo.infra.stop) a stop signal raises in the main
    thread, so a generate call ends even where it asks nothing, as in the prefill of a large batch:
    here SIGTERM arrives during the first forward pass (a hook on the first layer sends it), before
    any token was drawn; the call is abandoned, nothing is scored, the result is marked, and the
    model is left in the mode it had."""
    import os
    import signal

    from grpo.eval.evaluate import Interrupt, evaluate
    from grpo.infra.stop import StopFlag

    engine = _tiny_engine(tiny_model_dir)
    engine.model.train()
    stop, asked = StopFlag(), []
    handle = engine.model.model.layers[0].register_forward_hook(lambda *a: os.kill(os.getpid(), signal.SIGTERM))
    previous = signal.signal(signal.SIGTERM, stop.handler)
    try:
        samples = [{"prompt": f"What is {a} + 1?", "answer": str(a + 1)} for a in range(8)]
        out = evaluate(engine, samples, lambda c, s: 1.0, _settings(max_new_tokens=40, batch_size=4),
                       interrupt=Interrupt(requested=lambda: asked.append(1) or stop.signal is not None,
                                           abortable=stop.abortable))
    finally:
        signal.signal(signal.SIGTERM, previous)
        handle.remove()
    assert stop.signal == "SIGTERM" and out["interrupted"] is True and out["prompts_scored"] == 0
    assert len(asked) == 1  # once, before the first batch: no token of it was drawn (the hook never asked)
    assert engine.model.training


def test_the_stop_flag_raises_only_inside_its_region():
    """StopFlag: a signal outside abortable() only sets the flag; inside, it raises StopRequested once
    (a second signal while it unwinds does not raise again); entering with a signal already received
    raises at once."""
    import os
    import signal

    from grpo.infra.stop import StopFlag, StopRequested

    stop = StopFlag()
    previous = signal.signal(signal.SIGTERM, stop.handler)
    try:
        with stop.abortable():
            pass
        os.kill(os.getpid(), signal.SIGTERM)  # outside: recorded
        assert stop.signal == "SIGTERM"
        with pytest.raises(StopRequested):
            with stop.abortable():
                pytest.fail("entered with a stop already requested")
        fresh = StopFlag()
        signal.signal(signal.SIGTERM, fresh.handler)
        with pytest.raises(StopRequested):
            with fresh.abortable():
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(10_000_000):  # the handler runs at the next bytecode
                    pass
        os.kill(os.getpid(), signal.SIGTERM)  # after the region: no raise
        assert fresh.signal == "SIGTERM"
    finally:
        signal.signal(signal.SIGTERM, previous)
