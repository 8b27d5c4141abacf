"""VESPO's Gamma weight by hand (TRL's loss_type="vespo"), and LUSPO's aggregation."""

from __future__ import annotations

import math

import pytest
import torch

from grpo.core import LossInputs, LossSettings, aggregate, get_policy_loss, vespo_weights


def _two_sequences():
    """Sequence 0 (A = +1): log-ratios 0.5 and ln 2 - 0.5 (w = 2); sequence 1 (A = -1): one token of ratio 2,
    then padding (its log-ratio 5 must not count)."""
    old = torch.tensor([[-1.0, -2.0], [-1.5, -3.0]])  # [N, T]
    logp = old + torch.tensor([[0.5, math.log(2) - 0.5], [math.log(2), 5.0]])  # [N, T]
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])  # [N, T]
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])  # [N, T]
    return logp, old, adv, mask


def test_the_gamma_weight_by_hand():
    logp, old, adv, mask = _two_sequences()
    phi = vespo_weights(logp, old, adv, mask, k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0)  # [N, T]
    # A >= 0: e^3 * 2^2 * e^-6 = 4 e^-3; A < 0: e^2 * 2^3 * e^-4 = 8 e^-2
    assert torch.allclose(phi[0], torch.full((2,), 4 * math.exp(-3)), atol=1e-6)
    assert torch.allclose(phi[1], torch.full((2,), 8 * math.exp(-2)), atol=1e-6)
    on = vespo_weights(old, old, adv, mask, k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0)
    assert torch.allclose(on, torch.ones_like(on))  # phi(1) = 1: on-policy it is the plain policy gradient


def test_the_weight_is_trls_on_random_sequences():
    """Against TRL's own get_gamma_weights (TRL 1.16.0, installed with the dev extra) on random batches with
    one advantage per sequence of either sign, padding included."""
    trl_trainer = pytest.importorskip("trl.trainer.grpo_trainer")
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        n, t = 6, 7
        old = -torch.rand(n, t, generator=gen, dtype=torch.float64) * 3  # [N, T]
        logp = old + torch.randn(n, t, generator=gen, dtype=torch.float64) * 0.3  # [N, T]
        adv = torch.randn(n, 1, generator=gen, dtype=torch.float64).expand(n, t)  # [N, T]
        mask = (torch.arange(t)[None, :] < torch.randint(1, t + 1, (n, 1), generator=gen)).to(torch.float64)
        ours = vespo_weights(logp, old, adv, mask, k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0)
        theirs = trl_trainer.GRPOTrainer.get_gamma_weights(advantages=adv[:, :1], log_ratio_per_token=logp - old,
                                                           mask=mask, importance_sampling_ratio=None)  # [N, 1]
        torch.testing.assert_close(ours, theirs.expand(n, t))


def test_each_token_takes_the_shape_of_its_own_advantages_sign():
    logp, old, _, mask = _two_sequences()
    adv = torch.tensor([[0.0, -1.0], [-1.0, -1.0]])  # per-token advantages (process supervision, GAE)
    phi = vespo_weights(logp, old, adv, mask, k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0)
    assert math.isclose(float(phi[0, 0]), 4 * math.exp(-3), rel_tol=1e-6)  # A = 0 counts as non-negative
    assert math.isclose(float(phi[0, 1]), 8 * math.exp(-2), rel_tol=1e-6)  # w = 2 under the negative shape


def test_the_loss_is_the_weighted_policy_gradient_with_phi_detached():
    logp, old, adv, mask = _two_sequences()
    logp = logp.clone().requires_grad_(True)
    s = LossSettings(aggregation="token_mean")
    out = get_policy_loss("vespo").fn(LossInputs(logp=logp, old_logp=old, advantages=adv, mask=mask), s)
    out["loss"].backward()
    phi = torch.tensor([[4 * math.exp(-3)] * 2, [8 * math.exp(-2)] * 2])
    # token_mean over the 3 real tokens: d loss / d logp = -phi * A * mask / 3, phi taken as a constant
    assert torch.allclose(logp.grad, -phi * adv * mask / 3, atol=1e-6)
    want = float((-phi * adv * logp.detach() * mask).sum() / 3)
    assert math.isclose(float(out["loss"]), want, rel_tol=1e-6)
    assert math.isclose(float(out["vespo_phi_mean"]), float((phi * mask).sum() / 3), rel_tol=1e-6)


def test_luspo_sums_each_sequence_then_averages_over_sequences():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])  # [N, T]
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])  # [N, T]
    assert float(aggregate(loss, mask, mode="seq_mean_token_sum")) == (6.0 + 4.0) / 2
    assert float(aggregate(loss, mask, mode="seq_mean_token_sum", total=4)) == 10.0 / 4  # a global denominator
