"""The train/inference mismatch correction: importance weights and mismatch KL by hand, and the
weighted advantage equal to the surrogate loss multiplied token by token (TRL's formulation)."""

import math

import pytest
import torch

from grpo.core import correction_weights, mismatch_kl, policy_loss

# two sequences: row 0 has 3 tokens, row 1 has 2 (its third is padding)
TRAIN = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.4, 0.3, 0.7]], dtype=torch.float64))
ENGINE = torch.log(torch.tensor([[0.25, 0.4, 0.9], [0.1, 0.3, 0.01]], dtype=torch.float64))
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
# token ratios pi_train / pi_engine: row 0: 2, 0.5, 1; row 1: 4, 1 (padding: 70, must not count)


def test_token_truncate_by_hand():
    c = correction_weights(TRAIN, ENGINE, MASK, level="token", mode="truncate", low=None, high=3.0)
    torch.testing.assert_close(c.weights, torch.tensor([[2.0, 0.5, 1.0], [3.0, 1.0, 0.0]], dtype=torch.float64))
    m = c.metrics
    assert m["rollout_is_weight_mean"].item() == pytest.approx((2 + 0.5 + 1 + 3 + 1) / 5)
    assert m["rollout_is_weight_min"].item() == pytest.approx(0.5)
    assert m["rollout_is_weight_max"].item() == pytest.approx(3.0)
    assert m["rollout_is_clipped_share"].item() == pytest.approx(1 / 5)  # the 4 was clamped
    assert m["rollout_is_masked_share"].item() == 0.0


def test_token_mask_band_by_hand():
    # IcePop-style band [0.6, 3]: 0.5 (too low) and 4 (too high) are masked
    c = correction_weights(TRAIN, ENGINE, MASK, level="token", mode="mask", low=0.6, high=3.0)
    torch.testing.assert_close(c.weights, torch.tensor([[2.0, 0.0, 1.0], [0.0, 1.0, 0.0]], dtype=torch.float64))
    assert c.metrics["rollout_is_masked_share"].item() == pytest.approx(2 / 5)
    assert c.metrics["rollout_is_weight_min"].item() == 0.0


def test_sequence_and_geometric_levels_by_hand():
    # products: row 0: 2 * 0.5 * 1 = 1; row 1: 4 * 1 = 4. Geometric means: 1 and sqrt(4) = 2.
    seq = correction_weights(TRAIN, ENGINE, MASK, level="sequence", mode="mask", high=3.0)
    torch.testing.assert_close(seq.weights, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], dtype=torch.float64))
    assert seq.metrics["rollout_is_masked_share"].item() == pytest.approx(1 / 2)  # one of two sequences
    assert seq.metrics["rollout_is_weight_max"].item() == pytest.approx(1.0)
    tis = correction_weights(TRAIN, ENGINE, MASK, level="sequence", mode="truncate", high=3.0)
    torch.testing.assert_close(tis.weights, torch.tensor([[1.0, 1.0, 1.0], [3.0, 3.0, 0.0]], dtype=torch.float64))
    geo = correction_weights(TRAIN, ENGINE, MASK, level="geometric", mode="mask", low=0.5, high=3.0)
    torch.testing.assert_close(geo.weights, torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]], dtype=torch.float64))
    assert geo.metrics["rollout_is_weight_mean"].item() == pytest.approx(1.5)


def test_mismatch_kl_by_hand():
    # log r over the 5 tokens: ln 2, ln 0.5, 0, ln 4, 0
    logs = [math.log(2), math.log(0.5), 0.0, math.log(4), 0.0]
    k1 = sum(-x for x in logs) / 5
    k3 = sum(math.exp(x) - 1 - x for x in logs) / 5
    kl = mismatch_kl(TRAIN, ENGINE, MASK)
    assert kl["mismatch_kl_k1"].item() == pytest.approx(k1)
    assert kl["mismatch_kl_k3"].item() == pytest.approx(k3)
    assert kl["mismatch_kl_k3"].item() >= 0
    same = mismatch_kl(TRAIN, TRAIN, MASK)
    assert same["mismatch_kl_k1"].item() == 0.0 and same["mismatch_kl_k3"].item() == 0.0


def test_identical_policies_weigh_one_and_empty_rows_nothing():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    for level in ("token", "sequence", "geometric"):
        c = correction_weights(TRAIN, TRAIN, mask, level=level, mode="mask", low=0.5, high=2.0)
        torch.testing.assert_close(c.weights, mask.double())
        assert c.metrics["rollout_is_weight_mean"].item() == pytest.approx(1.0)
        assert c.metrics["rollout_is_masked_share"].item() == 0.0


def test_a_nan_engine_logprob_is_no_correction_and_a_huge_ratio_stays_finite():
    engine = ENGINE.clone()
    engine[0, 1] = float("nan")
    engine[1, 0] = -1e4  # ratio e^(1e4): overflows unless bounded
    c = correction_weights(TRAIN, engine, MASK, level="token", mode="truncate", high=None)
    assert c.weights[0, 1].item() == pytest.approx(1.0)
    assert torch.isfinite(c.weights).all()


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="level: unknown 'tok'; valid: token, sequence, geometric"):
        correction_weights(TRAIN, ENGINE, MASK, level="tok")
    with pytest.raises(ValueError, match="mode: unknown"):
        correction_weights(TRAIN, ENGINE, MASK, mode="clip")
    with pytest.raises(ValueError, match="low 2.0 > high 1.0"):
        correction_weights(TRAIN, ENGINE, MASK, low=2.0, high=1.0)


def test_weighted_advantages_equal_the_per_token_loss_times_the_weight():
    """TRL multiplies each token's surrogate loss by the weight; scaling the advantage by w >= 0 is
    the same loss and gradient (checked against a per-token loss computed here)."""
    g = torch.Generator().manual_seed(0)
    logp = (torch.randn(4, 5, generator=g, dtype=torch.float64) * 0.3 - 1.0).requires_grad_()
    old = logp.detach() + torch.randn(4, 5, generator=g, dtype=torch.float64) * 0.2
    adv = torch.randn(4, 1, generator=g, dtype=torch.float64).expand(4, 5)
    mask = torch.tensor([[1] * 5, [1] * 3 + [0] * 2, [1] * 4 + [0], [1] * 5])
    w = correction_weights(old, old + torch.randn(4, 5, generator=g, dtype=torch.float64) * 0.5, mask,
                           level="token", mode="mask", low=0.5, high=2.0).weights
    out = policy_loss(logp, old, adv * w, mask, eps_low=0.2, eps_high=0.2, aggregation="token_mean")
    ratio = torch.exp(logp - old)
    per_token = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv) * w  # [N, T]
    expected = (per_token * mask).sum() / mask.sum()
    torch.testing.assert_close(out["loss"], expected)
    (ga,) = torch.autograd.grad(out["loss"], logp)
    (gb,) = torch.autograd.grad(expected, logp)
    torch.testing.assert_close(ga, gb)
