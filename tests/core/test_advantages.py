"""Advantage estimators: hand-computed cases, properties, and a slow per-element reference."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo.core import ESTIMATORS, compute_advantages, gae, get_estimator
from grpo.core import process_advantages, whiten

REWARDS = torch.tensor([[0.20, 0.25, 0.10, 0.45]], dtype=torch.float64)


def test_grpo_hand_computed_bessel():
    # mean = (0.20 + 0.25 + 0.10 + 0.45) / 4 = 1.00 / 4 = 0.25
    # deviations: -0.05, 0.00, -0.15, +0.20; squares: 0.0025, 0, 0.0225, 0.04; sum = 0.065
    # Bessel: var = 0.065 / 3 = 0.0216667, std = 0.1471960
    # A = dev / std: -0.339683, 0, -1.019049, +1.358732
    adv = compute_advantages(REWARDS, estimator="grpo", std_eps=0.0)
    std = math.sqrt(0.065 / 3)
    expected = torch.tensor([[-0.05 / std, 0.0, -0.15 / std, 0.20 / std]], dtype=torch.float64)
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(adv, torch.tensor([[-0.339683, 0.0, -1.019049, 1.358732]],
                                                 dtype=torch.float64), atol=1e-6, rtol=0)


def test_grpo_hand_computed_population_std():
    # population: var = 0.065 / 4 = 0.01625, std = 0.1274755
    # A = -0.392232, 0, -1.176697, +1.568929
    adv = compute_advantages(REWARDS, estimator="grpo", std_eps=0.0, unbiased_std=False)
    torch.testing.assert_close(adv, torch.tensor([[-0.392232, 0.0, -1.176697, 1.568929]],
                                                 dtype=torch.float64), atol=1e-6, rtol=0)


def test_eps_enters_denominator():
    # std + eps with eps = 0.1: 0.20 / (0.1471960 + 0.1) = 0.809047
    adv = compute_advantages(REWARDS, estimator="grpo", std_eps=0.1)
    assert adv[0, 3].item() == pytest.approx(0.20 / (math.sqrt(0.065 / 3) + 0.1), rel=1e-9)


def test_other_estimators_hand_computed():
    r = REWARDS
    # dr_grpo: r - mean = -0.05, 0, -0.15, 0.20
    torch.testing.assert_close(compute_advantages(r, estimator="dr_grpo"),
                               torch.tensor([[-0.05, 0.0, -0.15, 0.20]], dtype=torch.float64))
    # rloo: r_1 - (0.25 + 0.10 + 0.45) / 3 = 0.20 - 0.266667 = -0.066667 = 4/3 * -0.05
    torch.testing.assert_close(compute_advantages(r, estimator="rloo"),
                               torch.tensor([[-0.2 / 3, 0.0, -0.2, 0.8 / 3]], dtype=torch.float64))
    torch.testing.assert_close(compute_advantages(r, estimator="reinforce"), r)
    two = torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    # mean_baseline: batch mean = 0.25 -> 0.75, -0.25, -0.25, -0.25
    torch.testing.assert_close(compute_advantages(two, estimator="mean_baseline"),
                               torch.tensor([[0.75, -0.25], [-0.25, -0.25]], dtype=torch.float64))
    # batch_std: group means 0.5 and 0 -> centered 0.5, -0.5, 0, 0; batch std (Bessel) of
    # [1, 0, 0, 0] = sqrt(0.75 / 3) = 0.5 -> 1, -1, 0, 0
    torch.testing.assert_close(compute_advantages(two, estimator="batch_std", std_eps=0.0),
                               torch.tensor([[1.0, -1.0], [0.0, 0.0]], dtype=torch.float64))


def test_unknown_estimator_lists_valid():
    with pytest.raises(ValueError, match="valid:.*grpo.*rloo"):
        get_estimator("ppo2")


def test_group_estimators_reject_group_of_one():
    with pytest.raises(ValueError, match="G >= 2"):
        compute_advantages(torch.ones(3, 1), estimator="grpo")
    with pytest.raises(ValueError, match="G >= 2"):
        compute_advantages(torch.ones(3, 1), estimator="rloo")


OUTCOME = sorted(name for name, e in ESTIMATORS.items() if not e.critic)
GROUP = sorted(name for name, e in ESTIMATORS.items() if e.group)  # compare within a group: need G >= 2


def test_all_outcome_estimators_share_one_signature():
    r = torch.rand(3, 4)
    for name in OUTCOME:
        out = ESTIMATORS[name](r, std_eps=1e-6, unbiased_std=False)
        assert out.shape == r.shape, name


def test_gae_is_the_registrys_critic_estimator_and_not_an_outcome_one():
    assert [name for name, e in ESTIMATORS.items() if e.critic] == ["gae"] and ESTIMATORS["gae"].fn is gae
    with pytest.raises(ValueError, match="critic"):
        compute_advantages(torch.rand(2, 4), estimator="gae")


# ---- a slow per-element reference for every estimator ---------------------------------------

def _reference(name, rewards, std_eps, unbiased):
    g = len(rewards[0])
    flat = [x for row in rewards for x in row]
    out = []
    for row in rewards:
        mean = sum(row) / g
        ss = sum((x - mean) ** 2 for x in row)
        const = max(row) == min(row)
        std = math.sqrt(ss / (g - 1 if unbiased else g))
        res = []
        for i, x in enumerate(row):
            if name == "grpo":
                res.append(0.0 if const else (x - mean) / (std + std_eps))
            elif name == "dr_grpo":
                res.append(0.0 if const else x - mean)
            elif name == "rloo":
                res.append(0.0 if const else x - (sum(row) - x) / (g - 1))
            elif name == "reinforce":
                res.append(x)
            elif name == "mean_baseline":
                res.append(x - sum(flat) / len(flat))
            elif name == "batch_std":
                bm = sum(flat) / len(flat)
                bs = math.sqrt(sum((y - bm) ** 2 for y in flat) / (len(flat) - 1 if unbiased else len(flat)))
                res.append(0.0 if const else (x - mean) / (bs + std_eps))
        out.append(res)
    return torch.tensor(out, dtype=torch.float64)


reward_batches = st.integers(1, 4).flatmap(lambda b: st.integers(2, 6).flatmap(
    lambda g: st.lists(st.lists(st.sampled_from([0.0, 0.5, 1.0, 0.25, -1.0, 2.0]) | st.floats(-3, 3),
                                min_size=g, max_size=g), min_size=b, max_size=b)))


@settings(max_examples=150, deadline=None)
@given(reward_batches, st.booleans(), st.sampled_from(OUTCOME))
def test_vectorized_equals_slow_reference(rows, unbiased, name):
    r = torch.tensor(rows, dtype=torch.float64)
    fast = compute_advantages(r, estimator=name, std_eps=1e-6, unbiased_std=unbiased)
    slow = _reference(name, rows, 1e-6, unbiased)
    torch.testing.assert_close(fast, slow, rtol=1e-6, atol=1e-6)


@settings(max_examples=100, deadline=None)
@given(reward_batches, st.sampled_from(GROUP))
def test_group_estimators_sum_to_zero_per_group(rows, name):
    adv = compute_advantages(torch.tensor(rows, dtype=torch.float64), estimator=name)
    torch.testing.assert_close(adv.sum(1), torch.zeros(len(rows), dtype=torch.float64), atol=1e-6, rtol=0)


@settings(max_examples=50, deadline=None)
@given(reward_batches)
def test_mean_baseline_sums_to_zero_over_batch(rows):
    adv = compute_advantages(torch.tensor(rows, dtype=torch.float64), estimator="mean_baseline")
    assert abs(adv.sum().item()) < 1e-9


@given(st.integers(1, 4), st.integers(2, 8), st.floats(-5, 5, allow_subnormal=False))
def test_zero_variance_group_gives_exact_zero(b, g, value):
    r = torch.full((b, g), value, dtype=torch.float32)
    for name in GROUP:
        adv = compute_advantages(r, estimator=name)
        assert torch.isfinite(adv).all(), name
        assert (adv == 0).all(), name


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-3, 3), min_size=3, max_size=8), st.floats(-10, 10), st.floats(0.1, 10))
def test_zscore_invariant_to_shift_and_positive_scale(row, shift, scale):
    r = torch.tensor([row], dtype=torch.float64)
    if r.std() < 1e-2:
        return  # eps dominates a near-constant group; the exact-zero test covers constants
    a = compute_advantages(r, estimator="grpo", std_eps=0.0)
    b = compute_advantages(r * scale + shift, estimator="grpo", std_eps=0.0)
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


# ---- process supervision -------------------------------------------------------------------

def test_process_advantages_hand_computed():
    # One prompt, G = 2, T = 6. Completion 0: steps end at tokens 1 and 4, rewards 1.0 and 0.0.
    # Completion 1: one step ending at token 2, reward 0.5 (second slot is padding, index -1).
    # Group's step rewards {1.0, 0.0, 0.5}: mean 0.5, Bessel std = sqrt((0.25 + 0.25 + 0) / 2) = 0.5
    # normalized: +1, -1, 0. Tokens of completion 0: t <= 1 sees both steps: 1 + -1 = 0;
    # 2 <= t <= 4 sees the second: -1; t = 5 is past every step: 0 (and masked out below).
    # Completion 1: t <= 2 -> 0; beyond -> 0.
    step_r = torch.tensor([[1.0, 0.0], [0.5, 0.0]])
    ends = torch.tensor([[1, 4], [2, -1]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]])
    adv = process_advantages(step_r, ends, mask, group_size=2, std_eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([[0.0, 0.0, -1.0, -1.0, -1.0, 0.0],
                                                  [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(2, 4), st.integers(1, 4), st.integers(3, 9), st.integers(0, 10**6))
def test_process_advantages_equals_loop_reference(b, g, s, t, seed):
    gen = torch.Generator().manual_seed(seed)
    n = b * g
    step_r = torch.rand(n, s, generator=gen, dtype=torch.float64)
    ends = torch.randint(-1, t, (n, s), generator=gen)
    mask = (torch.rand(n, t, generator=gen) > 0.2).long()
    fast = process_advantages(step_r, ends, mask, group_size=g, std_eps=1e-6)
    slow = torch.zeros(n, t, dtype=torch.float64)
    for gi in range(b):
        vals = [step_r[i, j].item() for i in range(gi * g, gi * g + g) for j in range(s) if ends[i, j] >= 0]
        if not vals:
            continue
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / max(len(vals) - 1, 1))
        for i in range(gi * g, gi * g + g):
            for tok in range(t):
                slow[i, tok] = mask[i, tok] * sum((step_r[i, j].item() - mean) / (std + 1e-6)
                                                  for j in range(s) if ends[i, j] >= tok)
    torch.testing.assert_close(fast, slow, rtol=1e-6, atol=1e-6)


# ---- GAE -----------------------------------------------------------------------------------

def test_gae_hand_computed_three_steps():
    # gamma = 0.9, lam = 0.5, rewards [0, 0, 1], values [0.5, 0.6, 0.7]
    # delta_2 = 1 + 0.9 * 0 - 0.7 = 0.3                    A_2 = 0.3
    # delta_1 = 0 + 0.9 * 0.7 - 0.6 = 0.03                 A_1 = 0.03 + 0.45 * 0.3 = 0.165
    # delta_0 = 0 + 0.9 * 0.6 - 0.5 = 0.04                 A_0 = 0.04 + 0.45 * 0.165 = 0.11425
    out = gae(torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.6, 0.7]]), torch.ones(1, 3),
              gamma=0.9, lam=0.5)
    torch.testing.assert_close(out["advantages"], torch.tensor([[0.11425, 0.165, 0.3]]))
    torch.testing.assert_close(out["returns"], torch.tensor([[0.61425, 0.765, 1.0]]))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 8), st.floats(0.5, 1.0), st.floats(0.0, 1.0), st.integers(0, 10**6))
def test_gae_equals_loop_reference_with_padding(n, t, gamma, lam, seed):
    gen = torch.Generator().manual_seed(seed)
    r = torch.randn(n, t, generator=gen, dtype=torch.float64)
    v = torch.randn(n, t, generator=gen, dtype=torch.float64)
    lengths = torch.randint(0, t + 1, (n,), generator=gen)
    mask = (torch.arange(t)[None] < lengths[:, None]).long()
    out = gae(r, v, mask, gamma=gamma, lam=lam)["advantages"]
    for i in range(n):
        L = int(lengths[i])
        a = 0.0
        for k in reversed(range(L)):
            nv = v[i, k + 1].item() if k + 1 < L else 0.0
            a = r[i, k].item() + gamma * nv - v[i, k].item() + gamma * lam * a
            assert out[i, k].item() == pytest.approx(a, abs=1e-9)
        assert (out[i, L:] == 0).all()


def test_whiten_zero_mean_unit_var_on_mask():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    m = torch.tensor([[1, 1, 1, 0]])
    w = whiten(x, m)
    assert w[0, :3].mean().abs() < 1e-6
    assert (w[0, :3].pow(2).mean() - 1).abs() < 1e-4
    assert w[0, 3] == 0
