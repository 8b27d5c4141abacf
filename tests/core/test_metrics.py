"""Diagnostics: clip fractions, zero-variance share, advantage variance, reward stats."""

import pytest
import torch

from grpo.core import advantage_group_variance, clip_fractions, reward_stats, zero_variance_share


def test_clip_fractions_hand_computed():
    # tokens: (r=1.5, A=+1) high-clipped; (r=0.5, A=-1) low-clipped; (r=1.5, A=-1) not clipped
    # (the clip does not bind for a bad token pushed up); (r=1.0, A=1) not; the 5th is masked.
    ratio = torch.tensor([[1.5, 0.5, 1.5, 1.0, 9.0]])
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    out = clip_fractions(ratio, adv, mask)
    assert out["clip_fraction_high"].item() == pytest.approx(0.25)
    assert out["clip_fraction_low"].item() == pytest.approx(0.25)
    assert out["clip_fraction"].item() == pytest.approx(0.5)


def test_zero_variance_share_and_group_variance():
    rewards = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.5, 0.5], [0.0, 0.0]])
    assert zero_variance_share(rewards).item() == 0.75
    adv = torch.tensor([[0.0, 0.0], [-1.0, 1.0]])
    # population variances 0 and 1 -> mean 0.5
    assert advantage_group_variance(adv).item() == 0.5


def test_reward_stats():
    out = reward_stats(torch.tensor([[0.0, 1.0], [1.0, 1.0]]))
    assert out["reward_mean"].item() == 0.75
    assert out["reward_std"].item() == pytest.approx(0.4330127)
    assert out["reward_group_std"].item() == pytest.approx(0.25)
