"""pass@k against brute-force enumeration; evaluation output shape."""

import itertools

import pytest

from grpo.eval.evaluate import pass_at_k


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
    out = evaluate(make_engine("hf", model, tok), samples, verifier, system_prompt="", max_new_tokens=3, batch_size=64,
                   pass_k=2, pass_prompts=2)
    assert calls == [(4, 4), (4, 4)]  # greedy on 4 prompts, then 2 prompts x 2 samples
    assert out["pass_prompts"] == 2 and out["pass@k"] == 0.0
