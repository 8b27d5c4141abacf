"""grpo_loss against a slow, literal transcription of DeepSeekMath equation (3)."""

import inspect
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo.core import AGGREGATIONS, KL_ESTIMATORS, grpo_loss, policy_loss


def _equation_3(logp, old, ref, rewards, mask, eps_lo, eps_hi, beta, kl, agg, std_eps):
    """J_GRPO per the paper, element by element, negated; aggregation modes as documented."""
    b, g = len(rewards), len(rewards[0])
    per_seq, tok_sum, tok_count = [], 0.0, 0
    for i in range(b * g):
        row = rewards[i // g]
        mean = sum(row) / g
        std = math.sqrt(sum((x - mean) ** 2 for x in row) / (g - 1))
        adv = 0.0 if max(row) == min(row) else (row[i % g] - mean) / (std + std_eps)
        s, count = 0.0, 0
        for t in range(len(mask[i])):
            if not mask[i][t]:
                continue
            rho = math.exp(logp[i][t] - old[i][t])
            surr = min(rho * adv, min(max(rho, 1 - eps_lo), 1 + eps_hi) * adv)
            d = ref[i][t] - logp[i][t]
            k = {"k1": -d, "k2": d * d / 2, "k3": math.exp(d) - d - 1}[kl]
            s += -(surr - beta * k)
            count += 1
        tok_sum += s
        tok_count += count
        per_seq.append(s / max(count, 1) if agg == "seq_mean_token_mean" else s if agg == "seq_mean_token_sum"
                       else s / len(mask[i]))
    if agg == "token_mean":
        return tok_sum / max(tok_count, 1)
    return sum(per_seq) / len(per_seq)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 3), st.integers(2, 4), st.integers(1, 6), st.sampled_from(AGGREGATIONS),
       st.sampled_from(KL_ESTIMATORS), st.floats(0.1, 0.3), st.floats(0.1, 0.4), st.floats(0.0, 0.2),
       st.integers(0, 10**6))
def test_grpo_loss_equals_equation_3(b, g, t, agg, kl, eps_lo, eps_hi, beta, seed):
    gen = torch.Generator().manual_seed(seed)
    n = b * g
    old = -torch.rand(n, t, generator=gen, dtype=torch.float64) * 3
    logp = old + 0.4 * torch.randn(n, t, generator=gen, dtype=torch.float64)
    ref = old + 0.3 * torch.randn(n, t, generator=gen, dtype=torch.float64)
    rewards = torch.randint(0, 3, (b, g), generator=gen).double() / 2
    mask = (torch.rand(n, t, generator=gen) > 0.25).long()
    loss, m = grpo_loss(logp, old, ref, rewards, mask, eps_low=eps_lo, eps_high=eps_hi, kl_coef=beta,
                        kl_estimator=kl, aggregation=agg)
    expected = _equation_3(logp.tolist(), old.tolist(), ref.tolist(), rewards.tolist(), mask.tolist(),
                           eps_lo, eps_hi, beta, kl, agg, 1e-6)
    assert loss.item() == pytest.approx(expected, rel=1e-9, abs=1e-9)
    for key in ("loss", "policy_loss", "kl", "clip_fraction", "reward_mean", "reward_std"):
        assert torch.isfinite(m[key]), key


def test_signature_is_the_documented_one():
    sig = inspect.signature(grpo_loss)
    assert list(sig.parameters)[:5] == ["logp", "old_logp", "ref_logp", "rewards", "mask"]
    defaults = {k: p.default for k, p in sig.parameters.items() if p.kind is p.KEYWORD_ONLY}
    assert defaults["eps_low"] == 0.2 and defaults["eps_high"] == 0.2
    assert defaults["kl_coef"] == 0.04 and defaults["kl_estimator"] == "k3"
    assert defaults["aggregation"] == "seq_mean_token_mean" and defaults["std_eps"] == 1e-6


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(2, 4), st.integers(1, 5), st.sampled_from(AGGREGATIONS),
       st.integers(0, 10**6))
def test_ratio_one_gradient_is_reinforce_gradient(b, g, t, agg, seed):
    # At rho = 1 (first pass, old = sg[logp]) and beta = 0, d loss / d logp = -A * w, where w is the
    # aggregation weight of the token: the REINFORCE gradient A * grad log pi, weighted and negated.
    gen = torch.Generator().manual_seed(seed)
    n = b * g
    logp = -torch.rand(n, t, generator=gen, dtype=torch.float64).requires_grad_()
    rewards = torch.rand(b, g, generator=gen, dtype=torch.float64)
    mask = torch.ones(n, t, dtype=torch.long)
    loss, _ = grpo_loss(logp, logp.detach(), None, rewards, mask, kl_coef=0.0, aggregation=agg)
    grad = torch.autograd.grad(loss, logp)[0]
    adv = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)
    per_token = n if agg == "seq_mean_token_sum" else n * t  # a token's weight: 1/N summing, else 1/(N T)
    reinforce = torch.autograd.grad(
        -(adv.reshape(n, 1) * logp).sum() / per_token, logp)[0]  # all weights equal with a full mask
    torch.testing.assert_close(grad, reinforce)


def test_kl_needs_reference():
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(torch.zeros(2, 2), torch.zeros(2, 2), torch.zeros(2, 2), torch.ones(2, 2), kl_coef=0.1)


def test_shape_mismatch_is_explained():
    with pytest.raises(ValueError, match="sequences"):
        grpo_loss(torch.zeros(3, 2), torch.zeros(3, 2), None, torch.zeros(2, 2), torch.ones(3, 2), kl_coef=0)


def test_entropy_bonus_lowers_loss_and_is_reported():
    logp = torch.zeros(2, 3)
    ent = torch.full((2, 3), 2.0)
    adv = torch.zeros(2, 3)
    out = policy_loss(logp, logp, adv, torch.ones(2, 3), entropy=ent, entropy_coef=0.1)
    assert out["loss"].item() == pytest.approx(-0.2)
    assert out["entropy"].item() == pytest.approx(2.0)


def test_every_core_function_documents_shapes():
    import ast
    from pathlib import Path

    import grpo.core

    for path in Path(grpo.core.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                doc = ast.get_docstring(node) or ""
                assert doc, f"{path.name}:{node.name} has no docstring"
                assert "[" in doc or "shape" in doc, f"{path.name}:{node.name}: docstring states no shapes"
        assert len(path.read_text().splitlines()) <= 400, f"{path.name} is over 400 lines"
