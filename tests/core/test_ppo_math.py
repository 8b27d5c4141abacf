"""The PPO baseline's pieces: clipped value loss, KL-shaped rewards, explained variance."""

import pytest
import torch

from grpo.core import clipped_value_loss, explained_variance, kl_shaped_rewards


def test_value_loss_clipping_hand_computed():
    # returns R = 1. Token 0: old 0, new 0.5 -> clipped to 0.2: max((0.5-1)^2, (0.2-1)^2) = 0.64
    # token 1: old 0, new -0.1 (inside the clip): both 1.21 -> 1.21; token 2 is masked out.
    v = torch.tensor([[0.5, -0.1, 9.0]], requires_grad=True)
    old = torch.zeros(1, 3)
    ret = torch.ones(1, 3)
    mask = torch.tensor([[1, 1, 0]])
    out = clipped_value_loss(v, old, ret, mask, clip_range=0.2)
    assert out["loss"].item() == pytest.approx(0.5 * (0.64 + 1.21) / 2)
    assert out["clip_fraction"].item() == pytest.approx(0.5)
    out["loss"].backward()
    # the clipped branch wins on token 0, so its gradient is 0; token 1: 0.5 * 2 * (-1.1) / 2 = -0.55
    assert v.grad[0].tolist() == pytest.approx([0.0, -0.55, 0.0])
    unclipped = clipped_value_loss(v.detach(), old, ret, mask, clip_range=None)
    assert unclipped["loss"].item() == pytest.approx(0.5 * (0.25 + 1.21) / 2)


def test_kl_in_reward_hand_computed():
    # beta = 0.1; log pi - log pi_ref = [0.5, -0.2, 0.3] on a 2-token completion (third is padding),
    # score 1 -> r = [-0.05, 0.02 + 1, 0]
    logp = torch.tensor([[0.0, 0.0, 0.0]])
    ref = torch.tensor([[-0.5, 0.2, -0.3]])
    mask = torch.tensor([[1, 1, 0]])
    r = kl_shaped_rewards(torch.tensor([1.0]), logp, ref, mask, kl_coef=0.1)
    torch.testing.assert_close(r, torch.tensor([[-0.05, 1.02, 0.0]]))
    # without a reference: only the score, on the last token
    torch.testing.assert_close(kl_shaped_rewards(torch.tensor([2.0]), logp, None, mask, kl_coef=0.1),
                               torch.tensor([[0.0, 2.0, 0.0]]))


def test_explained_variance():
    ret = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    mask = torch.ones(1, 4)
    assert explained_variance(ret, ret, mask).item() == pytest.approx(1.0)
    assert explained_variance(torch.full((1, 4), 2.5), ret, mask).item() == pytest.approx(0.0)
