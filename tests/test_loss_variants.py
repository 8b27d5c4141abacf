"""Loss variants by hand: CISPO, SAPO, GMPO, two-sided clipping, GDPO advantages, the high-entropy and
off-policy token masks (values and gradients computed in the test), their config rules, and one
tiny-model run per item that shows it in metrics.jsonl."""

import json
import math

import pytest
import torch

from grpo.config import Config
from grpo.core import (POLICY_LOSSES, LossSettings, clipped_surrogate, compute_advantages, gdpo_advantages,
                       high_entropy_mask, off_policy_sequence_mask, policy_loss)
from grpo.errors import ConfigError
from tests.conftest import TEST_BF16, TEST_SEED

D = torch.float64


def _leaf(rows):
    return torch.tensor(rows, dtype=D, requires_grad=True)


def _grad(out, logp):
    return torch.autograd.grad(out["loss"], logp)[0]


# ---- CISPO ---------------------------------------------------------------------------------------------------------

def test_cispo_by_hand_and_gradient_through_capped_tokens():
    """ratios [[1, 10], [e^-0.5, 1]], cap 5, A = [[1, 1], [-2, -2]], token mean: per token -sg(min(r, 5)) A logp."""
    logp = _leaf([[-1.0, -2.0], [-0.5, -1.5]])
    old = torch.tensor([[-1.0, -2.0 - math.log(10.0)], [0.0, -1.5]], dtype=D)
    adv = torch.tensor([[1.0, 1.0], [-2.0, -2.0]], dtype=D)
    mask = torch.ones(2, 2, dtype=D)
    kw = dict(aggregation="token_mean", cispo_ratio_max=5.0)
    out = policy_loss(logp, old, adv, mask, name="cispo", **kw)
    w = [[1.0, 5.0], [math.exp(-0.5), 1.0]]
    by_hand = sum(-w[i][j] * adv[i, j].item() * logp[i, j].item() for i in range(2) for j in range(2)) / 4
    assert out["loss"].item() == pytest.approx(by_hand, rel=1e-12)  # (1 + 10 - e^-0.5 - 3) / 4
    grad = _grad(out, logp)
    torch.testing.assert_close(grad, torch.tensor([[-w[0][0], -w[0][1]], [2 * w[1][0], 2 * w[1][1]]], dtype=D) / 4)
    assert out["clip_fraction"].item() == pytest.approx(0.25)
    # the point of CISPO: the capped token (r = 10, A > 0) still learns; PPO's clip drops its gradient
    assert grad[0, 1].item() == pytest.approx(-5 / 4)
    clip_grad = _grad(policy_loss(logp, old, adv, mask, name="clip", aggregation="token_mean"), logp)
    assert clip_grad[0, 1].item() == 0.0


# ---- SAPO ----------------------------------------------------------------------------------------------------------

def test_sapo_soft_gate_by_hand():
    """Per token -A * 4/tau * sigmoid(tau (r - 1)); gradient in logp -A * 4 s (1 - s) * r."""
    logp = _leaf([[0.0, -1.0]])
    old = torch.tensor([[-math.log(1.5), -1.0]], dtype=D)  # r = [1.5, 1]
    adv = torch.tensor([[1.0, -1.0]], dtype=D)  # tau_pos = 1 on the first token, tau_neg = 1.05 on the second
    out = policy_loss(logp, old, adv, torch.ones(1, 2, dtype=D), name="sapo", aggregation="token_mean",
                      sapo_tau_pos=1.0, sapo_tau_neg=1.05)
    s0 = 1 / (1 + math.exp(-0.5))
    f0, f1 = 4 * s0, 4 / 1.05 * 0.5
    assert out["loss"].item() == pytest.approx((-f0 + f1) / 2, rel=1e-12)
    g = _grad(out, logp)
    assert g[0, 0].item() == pytest.approx(-4 * s0 * (1 - s0) * 1.5 / 2, rel=1e-12)
    assert g[0, 1].item() == pytest.approx(1.0 / 2, rel=1e-12)  # on-policy: the plain policy gradient -A
    assert out["sapo_gate_mean"].item() == pytest.approx((4 * s0 * (1 - s0) + 1) / 2, rel=1e-12)


# ---- GMPO ----------------------------------------------------------------------------------------------------------

def test_gmpo_geometric_mean_clipped_in_log_space_by_hand():
    """Seq 0: A = 1, l = [0.1, 0.6, -0.8] -> min(l, clip(l)) = [0.1, 0.4, -0.8], mean -0.1, loss -e^-0.1.
    Seq 1: A = -2, l = [0.5, -0.6] (third token masked) -> max = [0.5, -0.4], mean 0.05, loss 2 e^0.05."""
    lr = [[0.1, 0.6, -0.8], [0.5, -0.6, 3.0]]
    logp = _leaf([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
    old = logp.detach() - torch.tensor(lr, dtype=D)
    adv = torch.tensor([[1.0] * 3, [-2.0] * 3], dtype=D)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=D)
    out = policy_loss(logp, old, adv, mask, name="gmpo", eps_low=0.4, eps_high=0.4)
    assert out["loss"].item() == pytest.approx((-math.exp(-0.1) + 2 * math.exp(0.05)) / 2, rel=1e-12)
    g = _grad(out, logp)
    # d/dl_t of -A exp(mean) = -A exp(mean) / |o_i| on unclipped tokens, 0 on clipped ones; / 2 sequences
    want = torch.tensor([[-math.exp(-0.1) / 3, 0.0, -math.exp(-0.1) / 3],
                         [2 * math.exp(0.05) / 2, 0.0, 0.0]], dtype=D) / 2
    torch.testing.assert_close(g, want)
    assert out["clip_fraction_high"].item() == pytest.approx(1 / 5) and out["clip_fraction_low"].item() == pytest.approx(1 / 5)
    # the unclipped geometric means: exp(-0.1 / 3) and exp(-0.05)
    assert out["ratio_mean"].item() == pytest.approx((math.exp(-0.1 / 3) + math.exp(-0.05)) / 2)


# ---- two-sided clip (INTELLECT-2's delta) ---------------------------------------------------------------------------

def test_clip_delta_caps_negative_advantage_ratios_by_hand():
    """A = -1, r = [5, 2, 0.5], delta 3, eps 0.2: loss |A| max(min(r, 3), clip(r)) = [3, 2, 0.8]; only r = 2
    has a gradient (d/dlogp = r); a positive-advantage token is untouched; the same as dual_clip = 3."""
    r = torch.tensor([[5.0, 2.0, 0.5, 5.0]], dtype=D)
    adv = torch.tensor([[-1.0, -1.0, -1.0, 1.0]], dtype=D)
    logp = _leaf([[0.0] * 4])
    ratio = torch.exp(logp + r.log())  # [1, 4] = r with d ratio / d logp = r
    tok = clipped_surrogate(ratio, adv, delta=3.0)
    torch.testing.assert_close(tok.detach(), torch.tensor([[3.0, 2.0, 0.8, -1.2]], dtype=D))
    g = torch.autograd.grad(tok.sum(), logp)[0]
    torch.testing.assert_close(g, torch.tensor([[0.0, 2.0, 0.0, 0.0]], dtype=D))
    dual = clipped_surrogate(torch.exp(logp + r.log()), adv, dual_clip=3.0)
    torch.testing.assert_close(tok, dual)
    old = -r.log()
    out = policy_loss(logp, old, adv, torch.ones(1, 4, dtype=D), clip_delta=3.0, aggregation="token_mean")
    assert out["clip_fraction_delta"].item() == pytest.approx(0.25)
    assert out["loss"].item() == pytest.approx((3.0 + 2.0 + 0.8 - 1.2) / 4)
    with pytest.raises(ValueError, match="delta"):
        clipped_surrogate(ratio, adv, delta=1.0)


# ---- GDPO ----------------------------------------------------------------------------------------------------------

def test_gdpo_normalizes_each_reward_then_sums_by_hand():
    """Group 0: r1 = [1, 0], r2 = [0, 0]; group 1: r1 = [1, 1], r2 = [0.2, 0.6]; weights [1, 0.5].
    Group z-scores (Bessel): r1 -> [+-1/sqrt2], 0; r2 -> 0, [-+1/sqrt2]; S = [[c, -c], [-c/2, c/2]], c = 1/sqrt2;
    std(S) = sqrt((2 c^2 + 2 c^2 / 4) / 3); A = S / std(S)."""
    per = torch.tensor([[[1.0, 0.0], [0.0, 0.0]], [[1.0, 0.2], [1.0, 0.6]]], dtype=D)  # [B, G, K]
    w = torch.tensor([1.0, 0.5], dtype=D)
    adv = gdpo_advantages(per, w, std_eps=1e-12)
    c = 1 / math.sqrt(2)
    s = math.sqrt((2 * c * c + 2 * c * c / 4) / 3)
    torch.testing.assert_close(adv, torch.tensor([[c, -c], [-c / 2, c / 2]], dtype=D) / s)
    # sum then normalise gives group 1's small reward the full unit scale of group 0's
    total = (per * w).sum(-1)  # [B, G]
    torch.testing.assert_close(compute_advantages(total, std_eps=1e-12).abs(), torch.full((2, 2), c, dtype=D))
    # a group whose every reward is constant keeps advantages of exactly 0
    flat = torch.cat([per, torch.ones(1, 2, 2, dtype=D)])  # [3, 2, 2]
    assert (gdpo_advantages(flat, w)[2] == 0).all()
    with pytest.raises(ValueError, match="per_reward"):
        gdpo_advantages(per, torch.ones(3, dtype=D))


# ---- high-entropy token mask ---------------------------------------------------------------------------------------

def test_high_entropy_mask_and_its_gradient_by_hand():
    """Counted entropies [0.1, 0.9, 0.5 | 0.7, 0.3] (one token masked), quantile 0.4: k = ceil(2) = 2, the
    tokens at 0.9 and 0.7 keep their gradient, the others have none, the denominators are unchanged."""
    ent = torch.tensor([[0.1, 0.9, 0.5], [0.7, 0.3, 5.0]], dtype=D)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=D)
    keep = high_entropy_mask(ent, mask, quantile=0.4)
    assert keep.tolist() == [[False, True, False], [True, False, False]]
    assert torch.equal(high_entropy_mask(ent, mask, quantile=1.0), mask > 0)
    logp = _leaf([[-1.0, -2.0, -0.5], [-0.3, -1.0, -2.0]])
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3], dtype=D)
    kw = dict(entropy=ent, aggregation="token_mean")
    full = _grad(policy_loss(logp, logp.detach(), adv, mask, **kw), logp)
    out = policy_loss(logp, logp.detach(), adv, mask, top_entropy_quantile=0.4, **kw)
    torch.testing.assert_close(_grad(out, logp), full * keep)  # on-policy: -A / 5 on kept tokens
    assert out["entropy_mask_share"].item() == pytest.approx(2 / 5)
    for name, entry in POLICY_LOSSES.items():  # the ranking spans the micro-batch: no zero-advantage skipping
        assert entry.zero_advantage_has_gradient(LossSettings(top_entropy_quantile=0.2)), name
    with pytest.raises(ValueError, match="entropy"):
        policy_loss(logp, logp.detach(), adv, mask, top_entropy_quantile=0.4)


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_every_loss_honours_the_token_masks(name):
    """A token that ``keep`` removes has no policy gradient in any entry (no KL or entropy term), and the
    kept tokens still have one."""
    from grpo.core import LossInputs

    gen = torch.Generator().manual_seed(4)
    logp = (-torch.rand(4, 5, generator=gen, dtype=D) * 2).requires_grad_(True)
    old = logp.detach() + 0.02 * torch.randn(4, 5, generator=gen, dtype=D)  # inside every clip range
    adv = torch.randn(4, 1, generator=gen, dtype=D).expand(4, 5)
    keep = (torch.rand(4, 5, generator=gen) > 0.5).to(D)
    keep[0] = 1.0
    ref = logp.detach() - 0.3 if POLICY_LOSSES[name].needs_ref_logp(LossSettings()) else None  # distill: a teacher
    out = POLICY_LOSSES[name].fn(LossInputs(logp, old, adv, torch.ones(4, 5, dtype=D), ref_logp=ref, keep=keep),
                                 LossSettings())
    g = _grad(out, logp)
    assert (g[keep == 0] == 0).all() and (g[0] != 0).all()


# ---- off-policy sequence mask ----------------------------------------------------------------------------------------

def test_off_policy_sequence_mask_by_hand():
    """Mean log(pi_old / pi_theta): seq 0 0.5 (A < 0: masked at delta 0.3), seq 1 0.1 (A < 0: kept),
    seq 2 1.0 (A > 0: kept)."""
    logp = _leaf([[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]])
    old = logp.detach() + torch.tensor([[0.2, 0.8], [0.1, 0.1], [1.0, 1.0]], dtype=D)
    adv = torch.tensor([[-1.0] * 2, [-0.5] * 2, [2.0] * 2], dtype=D)
    mask = torch.ones(3, 2, dtype=D)
    assert off_policy_sequence_mask(logp, old, adv, mask, threshold=0.3).tolist() == [False, True, True]
    kw = dict(aggregation="seq_mean_token_mean")
    full = _grad(policy_loss(logp, old, adv, mask, **kw), logp)
    out = policy_loss(logp, old, adv, mask, off_policy_mask_threshold=0.3, **kw)
    g = _grad(out, logp)
    assert (g[0] == 0).all() and (full[0] != 0).any()
    torch.testing.assert_close(g[1:], full[1:])
    assert out["off_policy_masked_share"].item() == pytest.approx(1 / 3)


# ---- config ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, field", [
    (dict(policy_loss="cispo", cov_mode="clip_cov"), "cov_mode"),
    (dict(policy_loss="sapo", dual_clip=3.0), "dual_clip"),
    (dict(policy_loss="gmpo", importance_sampling_level="sequence"), "importance_sampling_level"),
    (dict(clip_delta=1.1), "clip_delta"),
    (dict(top_entropy_quantile=0.0), "top_entropy_quantile"),
    (dict(off_policy_mask_threshold=0.5), "off_policy_mask_threshold"),
    (dict(multi_objective_aggregation="normalize_then_sum", advantage_estimator="rloo"), "multi_objective"),
    (dict(multi_objective_aggregation="mean"), "multi_objective_aggregation"),
    (dict(sapo_temperature_neg=0.0), "sapo_temperature_neg"),
])
def test_config_rules_name_the_field(kw, field):
    with pytest.raises(ConfigError, match=field):
        Config(**kw)


# ---- one tiny-model run per item -------------------------------------------------------------------------------------

RUNS = {
    "cispo": (dict(policy_loss="cispo", cispo_ratio_max=1.05), ("clip_fraction",)),
    "sapo": (dict(policy_loss="sapo"), ("sapo_gate_mean",)),
    "gmpo": (dict(policy_loss="gmpo", epsilon=0.01), ("clip_fraction",)),
    "clip_delta": (dict(epsilon=0.01, clip_delta=1.02), ("clip_fraction_delta",)),
    "masks_gdpo": (dict(top_entropy_quantile=0.3, off_policy_mask_threshold=0.0, dynamic_sampling=True,
                        multi_objective_aggregation="normalize_then_sum",
                        rewards="tests.rewards_for_tests:digit_share,length", reward_weights=[1.0, 0.5]),
                   ("entropy_mask_share", "off_policy_masked_share", "advantage_batch_std")),
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_tiny_run_logs_the_variant(name, tmp_path, tiny_model_dir, tiny_dataset):
    """Two update epochs of one step (so the ratio leaves 1) on the tiny model: the variant's metric is in
    metrics.jsonl and holds what it must on any seed."""
    from grpo.train import Trainer

    kw, keys = RUNS[name]
    cfg = Config(**{**dict(model=str(tiny_model_dir), task=str(tiny_dataset), output_dir=str(tmp_path / "run"),
                           max_steps=1, num_generations=4, prompts_per_step=2, per_device_train_batch_size=4,
                           max_completion_length=8, eval_prompts=0, rewards="tests.rewards_for_tests:digit_share",
                           learning_rate=1e-2, temperature=1.0, progress=False, report_to="none", seed=TEST_SEED,
                           reward_timeout=0.0, bf16=TEST_BF16, num_iterations=2, beta=0.0), **kw})
    t = Trainer(cfg)
    t.train()
    line = json.loads((t.run_dir / "metrics.jsonl").read_text().splitlines()[0])
    for key in keys:
        assert key in line and math.isfinite(line[key]), (key, line)
        assert 0.0 <= line[key] <= 1.0 + 1e-6, (key, line[key])
    assert math.isfinite(line["loss"])
    if name == "masks_gdpo":
        # every chunk keeps at least ceil(0.3 * its tokens): the token-weighted share is at least 0.3
        assert line["entropy_mask_share"] >= 0.3 - 1e-9
        assert line["advantage_batch_std"] == pytest.approx(1.0, abs=1e-4) or line["advantage_batch_std"] == 0.0


def test_gdpo_in_batch_preparation_fills_a_failed_completion_with_its_group_means():
    """BatchMaker's GDPO path: a failed completion (NaN in one reward) takes each reward's group mean
    of the others, as the summed reward does, so the others' advantages are those of the scores
    written that way by hand; the reward weights are the config's."""
    from grpo.infra.distributed import World
    from grpo.train.batch import BatchMaker
    from grpo.train.settings import batch_settings

    cfg = Config(rewards="numeric,length", reward_weights=[1.0, 0.5], multi_objective_aggregation="normalize_then_sum",
                 num_generations=3, prompts_per_step=2, per_device_train_batch_size=6)
    maker = BatchMaker(batch_settings(cfg), world=World(), forwards=None, policy=None, reference=None, critic=None,
                       step_reward=None, tokenizer=None)
    per = torch.tensor([[[1.0, 0.2], [0.0, float("nan")], [1.0, 0.4]],
                        [[0.0, 0.1], [1.0, 0.9], [0.0, 0.5]]])  # [B, G, K]
    failed = torch.isnan(per).any(-1)  # [B, G]
    filled = torch.tensor([[1.0, 0.5, 1.0], [0.0, 1.0, 0.0]])  # unused by GDPO
    by_hand = per.clone()
    by_hand[0, 1] = torch.tensor([1.0, 0.3])  # the group means of the other two completions
    want = gdpo_advantages(by_hand, torch.tensor([1.0, 0.5]), std_eps=cfg.std_eps)
    got = maker._advantages(filled, failed, per)
    torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match="per_reward"):
        maker._advantages(filled, failed, None)
