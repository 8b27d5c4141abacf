"""The stability tools' tensor math, against values worked out by hand."""

import math

import pytest
import torch

from grpo.core import (high_covariance_tokens, informative_groups, overlong_penalty, policy_filter, policy_loss,
                       reward_cv, token_covariance)


def test_informative_groups_drops_constant_and_failed_groups():
    nan = float("nan")
    rewards = torch.tensor([[1.0, 0.0, 1.0, 1.0],   # varies -> keep
                            [0.0, 0.0, 0.0, 0.0],   # all equal -> drop
                            [1.0, nan, 1.0, 1.0],   # the finite ones are equal -> drop
                            [nan, nan, nan, 0.5],   # one finite reward: no comparison -> drop
                            [0.5, nan, 0.2, nan]])  # two finite, different -> keep
    assert informative_groups(rewards).tolist() == [True, False, False, False, True]


def test_overlong_penalty_ramp():
    # L_max = 10, buffer 4: free up to 6; 7 -> (6-7)/4 = -0.25; 8 -> -0.5; 10 -> -1; beyond -> -1
    lengths = torch.tensor([3, 6, 7, 8, 10, 12])
    pen = overlong_penalty(lengths, max_length=10, buffer=4)
    torch.testing.assert_close(pen, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0]))
    with pytest.raises(ValueError, match="overlong buffer"):
        overlong_penalty(lengths, max_length=10, buffer=0)


def test_policy_filter_best_worst_and_variance():
    rewards = torch.tensor([[0.1, 0.9, 0.5, 0.9],
                            [0.3, 0.3, 0.3, 0.3]])
    # best_worst: highest (0.9, twice) and lowest (0.1); a constant group keeps everything (all tie)
    assert policy_filter(rewards, mode="best_worst").tolist() == [[True, True, False, True], [True] * 4]
    # population std of row 0: mean 0.6, deviations -.5 .3 -.1 .3 -> var (.25+.09+.01+.09)/4 = .11, std .332
    keep = policy_filter(rewards, mode="variance", min_std=0.3)
    assert keep.tolist() == [[True] * 4, [False] * 4]
    with pytest.raises(ValueError, match="valid"):
        policy_filter(rewards, mode="top")


def test_policy_filter_ignores_failed_rewards():
    """A failed reward (NaN) is neither the worst nor part of the spread (review: it used to count as 0)."""
    nan = float("nan")
    rewards = torch.tensor([[1.0, 0.5, nan, 0.7]])
    # best 1.0, worst 0.5 among the valid; the failed one is not kept
    assert policy_filter(rewards, mode="best_worst").tolist() == [[True, True, False, False]]
    # valid rewards 1, .5, .7: mean .7333, deviations .2667 -.2333 -.0333 -> var .0422, std .2055
    assert policy_filter(rewards, mode="variance", min_std=0.2).tolist() == [[True, True, False, True]]
    assert policy_filter(rewards, mode="variance", min_std=0.21).tolist() == [[False] * 4]


def test_token_covariance_and_top_selection():
    logp = torch.tensor([[-1.0, -3.0], [-2.0, -2.0]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    # masked means: logp (-1-3-2)/3 = -2, adv (1+1-1)/3 = 1/3
    # terms: (1)(2/3)=2/3, (-1)(2/3)=-2/3, (0)(-4/3)=0, masked 0
    cov = token_covariance(logp, adv, mask)
    torch.testing.assert_close(cov, torch.tensor([[2 / 3, -2 / 3], [0.0, 0.0]]))
    # 3 tokens * 0.34 -> 1 token: the largest term, (0, 0)
    sel = high_covariance_tokens(logp, adv, mask, fraction=0.34)
    assert sel.tolist() == [[True, False], [False, False]]
    # fraction 1: all masked tokens ranked, but only positive terms are chosen
    assert high_covariance_tokens(logp, adv, mask, fraction=1.0).tolist() == [[True, False], [False, False]]
    assert not high_covariance_tokens(logp, adv, mask, fraction=0.0).any()


def test_clip_cov_removes_gradient_of_selected_tokens_and_kl_cov_penalises_them():
    logp = torch.tensor([[-1.0, -3.0], [-2.0, -2.5]], requires_grad=True)
    old = logp.detach().clone()
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    mask = torch.ones(2, 2)
    # means: logp -2.125, adv 0; terms (1.125)(1), (-0.875)(1), (0.125)(-1), (-0.375)(-1) -> .375 .. top-1 is (0,0)
    out = policy_loss(logp, old, adv, mask, cov_mode="clip_cov", cov_fraction=0.25, aggregation="token_mean")
    out["loss"].backward()
    # token_mean loss = -sum(A r)/4, d/dlogp = -A/4 (r = 1) except the clipped token, whose gradient is 0
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.25], [0.25, 0.25]]))
    assert float(out["cov_token_share"]) == 0.25
    # KL-Cov with the policy moved: the selected token's loss gains coef * |logp - old|
    moved = (old + torch.tensor([[0.5, 0.0], [0.0, 0.0]])).requires_grad_(True)
    plain = policy_loss(moved, old, adv, mask, aggregation="token_mean", eps_low=10, eps_high=10)
    kl = policy_loss(moved, old, adv, mask, cov_mode="kl_cov", cov_fraction=0.25, kl_cov_coef=2.0,
                     aggregation="token_mean", eps_low=10, eps_high=10)
    # selection on the moved logp: means -1.875; (0,0) term (1.375)(1) is still the largest
    torch.testing.assert_close(kl["loss"] - plain["loss"], torch.tensor(2.0 * 0.5 / 4))


def test_reward_cv():
    rewards = torch.tensor([[1.0, 3.0], [2.0, 2.0], [0.0, 0.0]])
    # row 0: mean 2, population std 1 -> 0.5; row 1: std 0 -> 0; row 2: 0 / eps -> 0
    torch.testing.assert_close(reward_cv(rewards), torch.tensor([0.5, 0.0, 0.0]))
    assert math.isfinite(float(reward_cv(rewards).sum()))
