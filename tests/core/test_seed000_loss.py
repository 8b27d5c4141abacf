"""Seed 000's published ``GRPOLoss`` (rewritten here from its description) against grpo.core.

Seed 000, "系统代码实现": group advantages (r - mean) / (std + 1e-6) with torch's default (Bessel)
std; ratio exp(logp - old); -min(ratio A, clamp(ratio, 1 - eps, 1 + eps) A) + beta * k3 per token;
each sequence's masked token mean, then the mean over sequences. With the core's defaults this is
``grpo_loss``; three of its metrics are defined differently (docs/concepts/objective.md, "Where grpo's
metrics differ from a common GRPOLoss"), and the differences are asserted here.
"""

from __future__ import annotations

import pytest
import torch

from grpo.core import grpo_loss


def seed000_loss(logp, old, ref, rewards, mask, *, clip_eps=0.2, kl_beta=0.04, eps_std=1e-6):
    """The seed's class, as a function: returns (loss, its metrics)."""
    adv = (rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + eps_std)  # [B, G]
    adv = adv.reshape(-1, 1)  # [N, 1]
    ratio = torch.exp(logp - old)  # [N, T]
    pg = -torch.min(ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv)  # [N, T]
    kl = torch.exp(ref - logp) - (ref - logp) - 1.0  # [N, T]
    tok = pg + kl_beta * kl  # [N, T]
    loss = ((tok * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    with torch.no_grad():
        clipped = ((ratio > 1 + clip_eps) | (ratio < 1 - clip_eps)).float()  # [N, T]
        metrics = {"clip_fraction": (clipped * mask).sum() / mask.sum(),
                   "policy_loss": (pg * mask).sum() / mask.sum(),  # a token mean over the whole batch
                   "kl": (kl * mask).sum() / mask.sum(),
                   "reward_mean": rewards.mean(), "reward_std": rewards.std()}  # Bessel-corrected
    return loss, metrics


def _batch(gen, b, g, t):
    n = b * g
    logp = -torch.rand(n, t, generator=gen, dtype=torch.float64) * 3  # [N, T]
    old = logp + 0.3 * torch.randn(n, t, generator=gen, dtype=torch.float64)  # ratios well past 1 +- 0.2
    ref = logp + 0.2 * torch.randn(n, t, generator=gen, dtype=torch.float64)
    rewards = torch.rand(b, g, generator=gen, dtype=torch.float64)  # [B, G]
    lengths = torch.randint(1, t + 1, (n,), generator=gen)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).double()  # [N, T] right padding
    return logp.requires_grad_(), old, ref, rewards, mask


def test_seed000_grpoloss_equals_core_on_random_batches():
    gen = torch.Generator().manual_seed(0)
    fewer = 0  # batches where the seed counts clipped tokens that ours does not
    for b, g, t in [(1, 2, 5), (3, 4, 7), (2, 8, 16), (4, 16, 3)]:
        logp, old, ref, rewards, mask = _batch(gen, b, g, t)
        theirs, tm = seed000_loss(logp, old, ref, rewards, mask)
        ours, om = grpo_loss(logp, old, ref, rewards, mask)  # the core's defaults
        assert float(ours.detach()) == pytest.approx(float(theirs.detach()), abs=1e-6)
        g_theirs, = torch.autograd.grad(theirs, logp)
        g_ours, = torch.autograd.grad(ours, logp)
        torch.testing.assert_close(g_ours, g_theirs, atol=1e-9, rtol=1e-7)
        assert float(om["kl"]) == pytest.approx(float(tm["kl"]), abs=1e-9)
        assert float(om["reward_mean"]) == pytest.approx(float(tm["reward_mean"]), abs=1e-12)
        # ours: the population std of all rewards; the seed's: Bessel-corrected
        n = rewards.numel()
        assert float(om["reward_std"]) == pytest.approx(float(tm["reward_std"]) * ((n - 1) / n) ** 0.5, rel=1e-9)
        # ours: a token counts as clipped only where the clip removes its gradient (r > 1 + eps with
        # A > 0, r < 1 - eps with A < 0); the seed's counts either side whatever A's sign
        ratio = torch.exp(logp.detach() - old)
        adv = ((rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + 1e-6)).reshape(-1, 1)
        binding = (((ratio > 1.2) & (adv > 0)) | ((ratio < 0.8) & (adv < 0))).double()
        assert float(om["clip_fraction"]) == pytest.approx(float((binding * mask).sum() / mask.sum()), abs=1e-12)
        assert float(om["clip_fraction"]) <= float(tm["clip_fraction"])
        fewer += float(om["clip_fraction"]) < float(tm["clip_fraction"])
        # ours: the policy loss aggregated as the loss is (per sequence, then over sequences)
        pg = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
        per_seq = ((pg * mask).sum(-1) / mask.sum(-1)).mean()
        assert float(om["policy_loss"]) == pytest.approx(float(per_seq), abs=1e-9)
    assert fewer >= 3
