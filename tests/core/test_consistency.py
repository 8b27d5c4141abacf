"""The logic-consistency regulariser's mathematics by hand: penalties, the leave-one-out score-function
advantage, and the loss and gradient it gives through the clip loss on a tiny case."""

import pytest
import torch

from grpo.core import policy_loss
from grpo.core.logic_consistency import consistency_advantages, consistency_penalties


def test_penalties_sum_one_minus_cos_per_completion():
    cos = torch.tensor([0.9, 0.5, 0.2, 1.0], dtype=torch.float64)
    owner = torch.tensor([0, 0, 2, 2])
    got = consistency_penalties(cos, owner, 4)
    assert torch.allclose(got, torch.tensor([0.1 + 0.5, 0.0, 0.8 + 0.0, 0.0], dtype=torch.float64))


def test_leave_one_out_advantages_by_hand():
    pen = torch.tensor([[0.6, 0.0, 0.9], [0.3, 0.3, 0.3]], dtype=torch.float64)
    adv = consistency_advantages(pen, coef=0.05)
    # completion 0: -0.05 * (0.6 - (0.0 + 0.9) / 2) = -0.0075; 1: -0.05 * (0 - 0.75) = 0.0375; 2: -0.05 * (0.9 - 0.3)
    want = torch.tensor([[-0.0075, 0.0375, -0.03], [0.0, 0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(adv, want, atol=1e-15)
    with pytest.raises(ValueError, match="G=1"):
        consistency_advantages(pen[:, :1], coef=0.05)


def test_loss_and_gradient_by_hand_on_a_tiny_case():
    """One prompt, G = 2 completions of 2 and 1 tokens, equal rewards (GRPO advantage 0), penalties
    0.5 and 0.1, lambda 0.05: A_cons = (-0.02, +0.02). On-policy clip loss with GRPO's aggregation,
    L = -1/2 * sum_i A_i * mean_t ratio_it, so at ratio 1 L = -1/2 (-0.02 + 0.02) = 0 and
    dL/dlogp_it = -A_i / (2 |o_i|): (+0.005, +0.005) for the first, -0.01 for the second."""
    adv = consistency_advantages(torch.tensor([[0.5, 0.1]], dtype=torch.float64), coef=0.05).reshape(2, 1)
    assert torch.allclose(adv.squeeze(1), torch.tensor([-0.02, 0.02], dtype=torch.float64))
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -9.0]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    grpo_adv = torch.zeros(2, 1, dtype=torch.float64)  # equal rewards
    out = policy_loss(logp, logp.detach(), (grpo_adv + adv).expand(2, 2), mask)
    out["loss"].backward()
    assert abs(float(out["loss"].detach())) < 1e-15
    want = torch.tensor([[0.005, 0.005], [-0.01, 0.0]], dtype=torch.float64)
    assert torch.allclose(logp.grad, want, atol=1e-15)
    # the completion with the larger penalty is made less likely: a step against the gradient lowers its logp
    assert (logp.grad[0] > 0).all() and logp.grad[1, 0] < 0
