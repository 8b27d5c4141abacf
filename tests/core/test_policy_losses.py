"""Contract of every entry of core.POLICY_LOSSES: its zero-advantage declaration holds, a hole in the
mask is the same as the tokens left out by hand, and an unknown name lists the valid ones."""

import itertools

import pytest
import torch

from grpo.core import (AGGREGATIONS, POLICY_LOSSES, LossInputs, LossSettings, get_policy_loss, masked_mean,
                       masked_moments, policy_loss, whiten)

N, T, G = 8, 6, 2
ZERO_ROWS = torch.tensor([0, 1, 4])  # a whole group (0, 1) and one sequence of another group


def _settings_grid():
    """Settings that switch each term of a loss on and off, over every aggregation and ratio level."""
    grid = []
    for agg, level, kl, ent, cov in itertools.product(AGGREGATIONS, ("token", "sequence"), (0.0, 0.1), (0.0, 0.05),
                                                      (None, "clip_cov", "kl_cov")):
        grid.append(dict(aggregation=agg, ratio_level=level, kl_coef=kl, entropy_coef=ent, cov_mode=cov,
                         cov_fraction=0.3, eps_high=0.28, dual_clip=3.0 if kl else None))
    return grid


GRID = _settings_grid()


def _batch(seed: int, *, zero_all: bool = False):
    """theta [N, T] (the leaf the gradient is taken w.r.t.), logp = f(theta), entropy = g(theta), and
    fixed old, reference, advantages (per sequence; ZERO_ROWS exactly 0) and mask with a hole."""
    gen = torch.Generator().manual_seed(seed)
    theta = torch.randn(N, T, generator=gen, dtype=torch.float64).requires_grad_(True)
    base = theta.detach()
    old = -torch.nn.functional.softplus(base + 0.3 * torch.randn(N, T, generator=gen, dtype=torch.float64))
    ref = -torch.nn.functional.softplus(base + 0.3 * torch.randn(N, T, generator=gen, dtype=torch.float64))
    adv = torch.randn(N, 1, generator=gen, dtype=torch.float64).expand(N, T).clone()
    adv[ZERO_ROWS] = 0.0
    if zero_all:
        adv.zero_()
    mask = torch.ones(N, T, dtype=torch.float64)
    mask[:, -1] = 0.0
    mask[3, 2] = 0.0
    return theta, old, ref, adv, mask


def _loss(entry, theta, old, ref, adv, mask, settings, rows=None):
    """The entry's outputs on ``rows`` of the batch (logp and entropy computed from theta)."""
    logp = -torch.nn.functional.softplus(theta)  # [N, T]
    entropy = torch.sigmoid(theta) * 2.0  # [N, T] a differentiable stand-in for the token entropy
    if rows is not None:
        logp, entropy, old, ref, adv, mask = (x[rows] for x in (logp, entropy, old, ref, adv, mask))
    inputs = LossInputs(logp, old, adv, mask, ref_logp=ref, entropy=entropy)
    return entry.fn(inputs, settings)


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
@pytest.mark.parametrize("kw", GRID, ids=lambda kw: "-".join(str(v) for v in kw.values()))
def test_zero_advantage_declaration_holds(name, kw):
    """Declared no gradient: sequences with advantage 0 get an exactly zero gradient, and leaving them
    out (the denominator fixed) leaves the others' gradient as it was. Declared a gradient: they
    have one of their own or they move the others'."""
    entry = POLICY_LOSSES[name]
    theta, old, ref, adv, mask = _batch(0)
    total = mask.sum() if kw["aggregation"] == "token_mean" else float(N)
    s = LossSettings(**kw, total=total)
    full = torch.autograd.grad(_loss(entry, theta, old, ref, adv, mask, s)["loss"], theta)[0]  # [N, T]
    kept = torch.tensor([i for i in range(N) if i not in ZERO_ROWS.tolist()])
    part = torch.autograd.grad(_loss(entry, theta, old, ref, adv, mask, s, rows=kept)["loss"], theta)[0]
    own_zero = bool((full[ZERO_ROWS] == 0).all())
    others_same = torch.allclose(full[kept], part[kept], rtol=1e-12, atol=1e-15)
    if entry.zero_advantage_has_gradient(s):
        assert not (own_zero and others_same), f"{name} {kw}: declared a gradient, but the rows change nothing"
    else:
        assert own_zero and others_same, f"{name} {kw}: declared no gradient, but the rows change it"
        theta, old, ref, adv, mask = _batch(1, zero_all=True)
        grad = torch.autograd.grad(_loss(entry, theta, old, ref, adv, mask, s)["loss"], theta)[0]
        assert (grad == 0).all()


def _compact(x: torch.Tensor, mask: torch.Tensor, fill: float) -> torch.Tensor:
    """Each row's counted tokens moved to the front in order, the rest ``fill``. [N, T] -> [N, T]."""
    out = torch.full_like(x, fill)
    for i in range(x.shape[0]):
        vals = x[i][mask[i] > 0]
        out[i, :len(vals)] = vals
    return out


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
@pytest.mark.parametrize("kw", GRID, ids=lambda kw: "-".join(str(v) for v in kw.values()))
def test_mask_hole_equals_tokens_left_out(name, kw):
    """A 0 inside the mask (e.g. tool output) is the same loss and metrics as the sequence written
    without that token, for every aggregation and term."""
    entry = POLICY_LOSSES[name]
    gen = torch.Generator().manual_seed(2)
    logp = -torch.rand(N, T, generator=gen, dtype=torch.float64) * 3
    old = logp + 0.2 * torch.randn(N, T, generator=gen, dtype=torch.float64)
    ref = logp + 0.2 * torch.randn(N, T, generator=gen, dtype=torch.float64)
    ent = torch.rand(N, T, generator=gen, dtype=torch.float64)
    adv = torch.randn(N, 1, generator=gen, dtype=torch.float64).expand(N, T).clone()
    mask = torch.ones(N, T, dtype=torch.float64)
    mask[:, T // 2] = 0.0  # the hole
    mask[1, -2:] = 0.0  # and a shorter sequence
    s = LossSettings(**kw)
    holed = entry.fn(LossInputs(logp, old, adv, mask, ref_logp=ref, entropy=ent), s)
    c = {k: _compact(v, mask, -1.0) for k, v in dict(logp=logp, old=old, ref=ref, ent=ent, adv=adv).items()}
    by_hand = entry.fn(LossInputs(c["logp"], c["old"], c["adv"], _compact(mask, mask, 0.0), ref_logp=c["ref"],
                                  entropy=c["ent"]), s)
    assert set(holed) == set(by_hand)
    for key in holed:
        torch.testing.assert_close(holed[key], by_hand[key], rtol=1e-9, atol=1e-12, msg=key)


def test_every_entry_returns_0d_tensors_with_loss_and_policy_loss():
    """The trainer logs every key but loss and policy_loss as a scalar: each value must be 0-d."""
    logp = torch.zeros(2, 3)
    for name, entry in POLICY_LOSSES.items():
        ref = logp - 0.5 if entry.needs_ref_logp(LossSettings()) else None  # distill reads a teacher's
        out = entry.fn(LossInputs(logp, logp, torch.ones(2, 3), torch.ones(2, 3), ref_logp=ref, entropy=logp),
                       LossSettings())
        assert {"loss", "policy_loss"} <= set(out), name
        assert all(v.dim() == 0 for v in out.values()), name


def test_clip_default_metrics_are_the_logged_ones():
    """The default loss returns exactly the metrics the trainer has always logged (no new key)."""
    logp = torch.zeros(2, 3)
    out = policy_loss(logp, logp, torch.ones(2, 3), torch.ones(2, 3), entropy=logp)
    assert set(out) == {"loss", "policy_loss", "kl", "entropy", "ratio_mean", "clip_fraction", "clip_fraction_low",
                        "clip_fraction_high"}
    cov = policy_loss(logp, logp, torch.ones(2, 3), torch.ones(2, 3), cov_mode="clip_cov")
    assert set(cov) - set(out) == {"cov_token_share"}


def test_unknown_name_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown policy loss 'nope'.*clip"):
        get_policy_loss("nope")
    with pytest.raises(ValueError, match="clip"):
        policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), name="nope")
    with pytest.raises(TypeError):
        policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), eps_lo=0.1)


def test_clip_declarations():
    clip = get_policy_loss("clip")
    assert clip.needs_old_logp
    assert not clip.needs_ref_logp(LossSettings()) and clip.needs_ref_logp(LossSettings(kl_coef=0.04))
    assert not clip.needs_entropy(LossSettings()) and clip.needs_entropy(LossSettings(entropy_coef=0.01))
    assert not clip.zero_advantage_has_gradient(LossSettings(dual_clip=3.0, ratio_level="sequence"))
    for kw in (dict(kl_coef=0.04), dict(entropy_coef=0.01), dict(cov_mode="clip_cov"), dict(cov_mode="kl_cov")):
        assert clip.zero_advantage_has_gradient(LossSettings(**kw)), kw


def _reference_moments(x, m):
    """The two-pass masked mean and variance as each caller wrote it out before masked_moments."""
    m = m.to(x.dtype)
    count = m.sum().clamp(min=1)
    mean = (x * m).sum() / count
    return mean, (((x - mean) * m) ** 2).sum() / count


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_masked_moments_bit_equal_to_the_two_pass_formula(dtype):
    gen = torch.Generator().manual_seed(3)
    for _ in range(5):
        x = torch.randn(5, 7, generator=gen).to(dtype) * 10 + 3
        m = torch.rand(5, 7, generator=gen) > 0.4
        mean, var = masked_moments(x, m)
        ref_mean, ref_var = _reference_moments(x, m)
        assert torch.equal(mean, ref_mean) and torch.equal(var, ref_var)
        assert torch.equal(masked_mean(x, m), ref_mean)
        assert torch.equal(masked_mean(x, m, dim=1), (x * m).sum(1) / m.to(dtype).sum(1).clamp(min=1))
        assert torch.equal(whiten(x, m), (x - ref_mean) * torch.rsqrt(ref_var + 1e-8) * m.to(dtype))
    # a reduce over holders of shares of a batch: two halves summed give the statistics of the whole
    x, m = torch.randn(6, 4, generator=gen).to(dtype), torch.rand(6, 4, generator=gen) > 0.3
    halves = [(x[:3], m[:3]), (x[3:], m[3:])]
    # stand-in for an all-reduce: the other half's partial sums, in the same order of calls
    other = iter([m[3:].to(dtype).sum(), (x[3:] * m[3:]).sum()])
    mean, _ = masked_moments(*halves[0], reduce=lambda part: part + next(other), var=False)
    torch.testing.assert_close(mean, masked_mean(x, m))
