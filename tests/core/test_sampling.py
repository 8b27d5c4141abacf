"""The sampling distribution q (grpo.core.sampling) against transformers' own processors, by hand on small
cases, and the draws of the keyed sampler against q's probabilities."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

from grpo.core import processed_logprobs, processed_scores, seen_tokens, truncates
from grpo.rollout.keys import KeyedSampler

SETTINGS = [dict(temperature=1.0), dict(temperature=0.7, top_k=5), dict(temperature=1.3, top_p=0.8),
            dict(temperature=0.9, min_p=0.1), dict(temperature=1.0, repetition_penalty=1.3),
            dict(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05, repetition_penalty=1.2)]


def _hf(scores, context, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0):
    """transformers' generate order: the penalty (a processor), then the warpers."""
    procs = [RepetitionPenaltyLogitsProcessor(repetition_penalty)] if repetition_penalty != 1.0 else []
    procs += [TemperatureLogitsWarper(temperature)] if temperature != 1.0 else []
    procs += [TopKLogitsWarper(top_k)] if top_k else []
    procs += [TopPLogitsWarper(top_p)] if top_p < 1.0 else []
    procs += [MinPLogitsWarper(min_p)] if min_p > 0.0 else []
    for p in procs:
        scores = p(context, scores)
    return scores


@pytest.mark.parametrize("settings", SETTINGS)
def test_processed_scores_are_transformers_processors(settings):
    torch.manual_seed(0)
    scores = torch.randn(6, 300) * 3  # [M, V]
    context = torch.randint(0, 300, (6, 40))  # [M, L]
    seen = seen_tokens(context, torch.ones_like(context), 300)
    ours = processed_scores(scores, seen=seen, **settings)
    ref = _hf(scores.clone(), context, **settings)
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))
    torch.testing.assert_close(ours[~torch.isinf(ours)], ref[~torch.isinf(ref)], atol=1e-5, rtol=0)
    assert truncates(**{k: v for k, v in settings.items() if k != "temperature"}) == (len(settings) > 1)


def test_by_hand_top_k_top_p_min_p_and_the_penalty():
    scores = torch.tensor([[2.0, 1.0, 0.0, -1.0]])  # p ~ .64 .24 .09 .03
    assert torch.isinf(processed_scores(scores, temperature=1.0, top_k=2)).tolist() == [[False, False, True, True]]
    # top_p 0.7: the smallest set reaching 0.7 is {0, 1} (0.64 alone does not)
    assert torch.isinf(processed_scores(scores, temperature=1.0, top_p=0.7)).tolist() == [[False, False, True, True]]
    # min_p 0.2: below 0.2 * 0.64 = 0.128 go
    assert torch.isinf(processed_scores(scores, temperature=1.0, min_p=0.2)).tolist() == [[False, False, True, True]]
    seen = torch.tensor([[True, False, False, True]])
    pen = processed_scores(scores, temperature=1.0, repetition_penalty=2.0, seen=seen)
    assert pen.tolist() == [[1.0, 1.0, 0.0, -2.0]]  # positive halved, negative doubled, unseen kept
    q = processed_logprobs(scores, torch.tensor([1]), temperature=1.0, top_k=2)
    torch.testing.assert_close(q, torch.log(torch.tensor([1.0 / (1.0 + torch.e)])))  # renormalized over the two kept


@pytest.mark.parametrize("settings", [dict(temperature=0.9, min_p=0.15), dict(temperature=1.0, repetition_penalty=1.5)])
def test_keyed_draws_follow_q(settings):
    """20,000 keyed draws from a fixed 8-token distribution pass a chi-square test against q's probabilities,
    and tokens q drops are never drawn."""
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0]])  # [1, V]
    seen = torch.tensor([[True, False, True, False, False, False, False, False]])
    q = processed_scores(logits, seen=seen, **settings).softmax(-1)[0]
    sampler = KeyedSampler([], 0, **settings)
    counts = torch.zeros(8)
    for key in range(20_000):
        counts[int(sampler.draw(logits, 0, [key], seen=seen)[0])] += 1
    assert counts[q == 0].sum() == 0
    expected = q[q > 0] * 20_000
    chi2 = float(((counts[q > 0] - expected) ** 2 / expected).sum())
    dof = int((q > 0).sum()) - 1
    assert chi2 < dof + 5 * (2 * dof) ** 0.5, (chi2, counts.tolist(), expected.tolist())
