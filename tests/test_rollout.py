"""The HF sampler: group layout, masks up to the first EOS, and sampling log-probs that match a
recomputation under the same temperature."""

import pytest
import torch

from grpo.models import load_models
from grpo.models.logprobs import completion_logprobs
from grpo.rollout import completion_mask_from_ids, generate_rollout
from grpo.rollout.keys import KeyedSampler, keyed_gumbel, row_base, row_keys


def test_mask_stops_after_first_eos():
    ids = torch.tensor([[5, 2, 7, 2], [5, 6, 7, 8]])
    out = completion_mask_from_ids(ids, [2])
    assert out["mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert out["truncated"].tolist() == [False, True]


def test_sampling_logprobs_match_recomputed(tiny_model_dir):
    m = load_models(str(tiny_model_dir), need_reference=False)
    torch.manual_seed(0)
    ro = generate_rollout(m.policy, m.tokenizer, ["What is 1 + 1?", "Hi"], group_size=3, max_new_tokens=6,
                          temperature=0.7)
    assert ro.completion_ids.shape[0] == 6 and len(ro.texts) == 6
    assert torch.equal(ro.prompt_ids[0], ro.prompt_ids[2])  # rows are grouped by prompt
    with torch.no_grad():
        again = completion_logprobs(m.policy, ro.prompt_ids, ro.prompt_mask, ro.completion_ids,
                                    ro.completion_mask, temperature=0.7)["logp"]
    mask = ro.completion_mask.bool()
    torch.testing.assert_close(ro.sampling_logp[mask], again[mask], atol=1e-4, rtol=0)


def _warped_probs(logits: torch.Tensor, *, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Reference: softmax of logits / T restricted to the top-k, then to the smallest set whose
    probability reaches top_p (the tokens generate may sample)."""
    p = torch.softmax(logits / temperature, -1)
    order = p.argsort(descending=True)
    keep = torch.zeros_like(p, dtype=torch.bool)
    keep[order[:top_k]] = True
    sorted_p = p[order] * keep[order]
    sorted_p = sorted_p / sorted_p.sum()
    cum_before = sorted_p.cumsum(0) - sorted_p
    nucleus = torch.zeros_like(keep)
    nucleus[order[cum_before < top_p]] = True
    q = p * keep * nucleus
    return q / q.sum()


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8)])
def test_keyed_sampler_draws_the_warped_softmax(temperature, top_k, top_p):
    """Gumbel-max over warped logits samples exactly softmax(warped): 20,000 keyed draws from a fixed
    8-token distribution pass a chi-square test against the exact probabilities (the keys are fixed,
    so the test is deterministic), and tokens outside top-k/top-p are never drawn."""
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0]])  # [1, V]
    draws = 20_000
    proc = KeyedSampler(list(range(draws)), 0, temperature=temperature, top_p=top_p, top_k=top_k)
    counts = torch.zeros(8)
    for key in range(draws):
        proc.keys = [key]
        counts[int(proc(torch.zeros(1, 0, dtype=torch.long), logits).argmax())] += 1
    q = _warped_probs(logits[0], temperature=temperature, top_k=top_k or 8, top_p=top_p)
    assert counts[q == 0].sum() == 0
    expected = q[q > 0] * draws
    chi2 = float(((counts[q > 0] - expected) ** 2 / expected).sum())
    dof = int((q > 0).sum()) - 1
    assert chi2 < dof + 5 * (2 * dof) ** 0.5, (chi2, counts.tolist(), expected.tolist())  # far from p < 1e-4 territory


def test_keyed_noise_is_uniform_and_fixed_by_key_and_step():
    """The uniform numbers behind the noise: deciles of 4 x 5,000 are each within 10% of 2,000; the
    same (key, step) gives the same noise, another step or key other noise."""
    noise = keyed_gumbel([row_base(k, 3) for k in range(4)], 5000)  # [4, V]
    u = torch.exp(-torch.exp(-noise.double()))  # back to the uniform numbers
    counts = torch.histc(u, bins=10, min=0.0, max=1.0)
    assert bool(((counts - 2000).abs() < 200).all()), counts.tolist()
    assert torch.equal(noise, keyed_gumbel([row_base(k, 3) for k in range(4)], 5000))
    assert not torch.equal(noise[0], keyed_gumbel([row_base(0, 4)], 5000)[0])
    assert not torch.equal(noise[0], noise[1])


def test_native_draw_equals_the_pytorch_draw():
    """decode_ops.c's gumbel_argmax draws the tokens the PyTorch noise draws, on 64 rows of random
    scores over 3,000 tokens at 5 steps, with top-k leaving -inf scores."""
    from tests.conftest import need_native

    need_native()
    torch.manual_seed(0)
    sampler = KeyedSampler([], 0, temperature=0.7, top_p=1.0, top_k=50)
    scores = torch.randn(64, 3000) * 3
    for t in range(5):
        keys = row_keys(1, t, 0, 64)
        assert torch.equal(sampler.draw(scores, t, keys), sampler.draw(scores, t, keys, use_native=False))


def test_keyed_rollouts_do_not_depend_on_the_batch(tiny_model_dir):
    """A row's completion depends only on its key: prompts sampled together equal the same prompts
    sampled one by one (as on different processes under torchrun), and other keys give other tokens."""
    m = load_models(str(tiny_model_dir), need_reference=False)
    prompts = ["What is 1 + 1?", "Hi", "What is 12 + 30?"]
    kw = dict(group_size=2, max_new_tokens=8, temperature=1.0, top_p=0.95, with_logprobs=False)
    keys = row_keys(7, 3, 0, 6)
    together = generate_rollout(m.policy, m.tokenizer, prompts, keys=keys, **kw)
    for i, p in enumerate(prompts):
        alone = generate_rollout(m.policy, m.tokenizer, [p], keys=keys[2 * i:2 * i + 2], **kw)
        assert alone.texts == together.texts[2 * i:2 * i + 2]
    other = generate_rollout(m.policy, m.tokenizer, prompts, keys=row_keys(7, 4, 0, 6), **kw)
    assert other.texts != together.texts
    assert together.texts[0] != together.texts[1]  # two members of a group differ
