"""The distill policy loss (core.distill): value and gradient by hand on a tiny case, and the gradient's
expectation over the student's own samples equal to the gradient of the exact reverse KL."""

import math

import pytest
import torch

from grpo.core import POLICY_LOSSES, LossSettings, policy_loss, reverse_kl_tokens

D = torch.float64


def test_loss_and_gradient_by_hand():
    """Two sequences, three tokens, one masked. On-policy (old = logp) the ratio is 1: token value
    k = logp - teacher, d loss / d logp_t = k_t / |o_i| / N under seq_mean_token_mean."""
    logp = torch.tensor([[math.log(0.5), math.log(0.25), math.log(0.9)],
                         [math.log(0.2), math.log(0.8), -5.0]], dtype=D, requires_grad=True)
    teacher = torch.tensor([[math.log(0.25), math.log(0.5), math.log(0.9)],
                            [math.log(0.4), math.log(0.4), -1.0]], dtype=D)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=D)
    out = policy_loss(logp, logp.detach(), torch.zeros(2, 3, dtype=D), mask, name="distill", ref_logp=teacher,
                      kl_coef=0.0)
    l2 = math.log(2)
    k = [[l2, -l2, 0.0], [-l2, l2, 0.0]]  # log 0.5 - log 0.25 = ln 2, ...; row 1 token 2 masked
    assert out["loss"].item() == pytest.approx(((k[0][0] + k[0][1] + k[0][2]) / 3 + (k[1][0] + k[1][1]) / 2) / 2)
    assert out["distill_reverse_kl"].item() == pytest.approx(0.0)  # (ln2 - ln2 + 0 - ln2 + ln2) / 5
    out["loss"].backward()
    want = torch.tensor([[l2 / 6, -l2 / 6, 0.0], [-l2 / 4, l2 / 4, 0.0]], dtype=D)
    torch.testing.assert_close(logp.grad, want)


def test_expected_gradient_is_the_exact_reverse_kl_gradient():
    """One position, a vocabulary of 4: student softmax(z), teacher q. Summing the loss's gradient in z
    over every token y the student could sample, weighted by its probability, gives the gradient of
    KL(softmax(z) || q) computed in closed form; the loss's value so weighted is that KL."""
    z = torch.tensor([0.3, -1.0, 0.8, 0.1], dtype=D, requires_grad=True)
    q = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=D)
    expected_grad = torch.zeros(4, dtype=D)
    expected_value = 0.0
    p = torch.softmax(z, 0).detach()
    for y in range(4):
        logp = torch.log_softmax(z, 0)[y].reshape(1, 1)  # [N=1, T=1]
        out = policy_loss(logp, logp.detach(), torch.zeros(1, 1, dtype=D), torch.ones(1, 1, dtype=D),
                          name="distill", ref_logp=q.log()[y].reshape(1, 1))
        (g,) = torch.autograd.grad(out["loss"], z)
        expected_grad += p[y] * g
        expected_value += p[y].item() * out["loss"].item()
    kl = (torch.softmax(z, 0) * (torch.log_softmax(z, 0) - q.log())).sum()
    (exact,) = torch.autograd.grad(kl, z)
    torch.testing.assert_close(expected_grad, exact)
    assert expected_value == pytest.approx(kl.item())


def test_tokens_of_another_sampler_with_their_importance_weight_give_the_exact_reverse_kl():
    """The student's tokens drawn by another policy mu (older weights, another engine): each loss
    term weighted by w = pi / mu (LossInputs.weight) and averaged over mu's draws gives KL(pi || q) and
    its exact gradient, as the student's own draws do; without the weight, it does not."""
    z = torch.tensor([0.3, -1.0, 0.8, 0.1], dtype=D, requires_grad=True)
    q = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=D)
    mu = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=D)
    p = torch.softmax(z, 0).detach()
    kl = (torch.softmax(z, 0) * (torch.log_softmax(z, 0) - q.log())).sum()
    (exact,) = torch.autograd.grad(kl, z)
    for weighted in (True, False):
        grad, value = torch.zeros(4, dtype=D), 0.0
        for y in range(4):
            logp = torch.log_softmax(z, 0)[y].reshape(1, 1)  # [N=1, T=1]
            w = (p[y] / mu[y]).reshape(1, 1) if weighted else None
            out = policy_loss(logp, logp.detach(), torch.zeros(1, 1, dtype=D), torch.ones(1, 1, dtype=D),
                              name="distill", ref_logp=q.log()[y].reshape(1, 1), weight=w)
            (g,) = torch.autograd.grad(out["loss"], z)
            grad += mu[y] * g
            value += mu[y].item() * out["loss"].item()
        if weighted:
            torch.testing.assert_close(grad, exact)
            assert value == pytest.approx(kl.item())
        else:
            assert abs(value - kl.item()) > 0.05


def test_off_policy_ratio_weights_the_gradient():
    """Past the first pass (old != logp) the token's gradient is r * k: with r = e^0.5 and k = ln 2 /
    ... checked on one token."""
    logp = torch.tensor([[-1.0]], dtype=D, requires_grad=True)
    old, teacher = torch.tensor([[-1.5]], dtype=D), torch.tensor([[-1.0 - math.log(2)]], dtype=D)
    out = policy_loss(logp, old, torch.zeros(1, 1, dtype=D), torch.ones(1, 1, dtype=D), name="distill",
                      ref_logp=teacher)
    out["loss"].backward()
    assert out["loss"].item() == pytest.approx(math.exp(0.5) * math.log(2))
    assert logp.grad.item() == pytest.approx(math.exp(0.5) * math.log(2))


def test_mixed_with_grpo_adds_the_weighted_surrogate():
    """distill_grpo_weight w: loss = reverse KL + w * clip surrogate, the surrogate the clip loss's own."""
    gen = torch.Generator().manual_seed(0)
    logp = (-torch.rand(4, 5, generator=gen, dtype=D) * 2).requires_grad_(True)
    teacher = logp.detach() - torch.rand(4, 5, generator=gen, dtype=D)
    adv = torch.randn(4, 1, generator=gen, dtype=D).expand(4, 5)
    mask = torch.ones(4, 5, dtype=D)
    pure = policy_loss(logp, logp.detach(), adv, mask, name="distill", ref_logp=teacher)["loss"]
    mixed = policy_loss(logp, logp.detach(), adv, mask, name="distill", ref_logp=teacher,
                        distill_grpo_weight=0.5)["loss"]
    grpo = policy_loss(logp, logp.detach(), adv, mask, name="clip")["loss"]
    torch.testing.assert_close(mixed, pure + 0.5 * grpo)
    g_mixed = torch.autograd.grad(mixed, logp)[0]
    g_sum = torch.autograd.grad(pure + 0.5 * grpo, logp)[0]
    torch.testing.assert_close(g_mixed, g_sum)


def test_registered_with_its_needs():
    entry = POLICY_LOSSES["distill"]
    assert entry.needs_ref_logp(LossSettings(kl_coef=0.0))  # the teacher's log-probs, always
    assert entry.zero_advantage_has_gradient(LossSettings())  # every sampled token has a KL gradient
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), name="distill")
    assert reverse_kl_tokens(torch.tensor([[-1.0]]), torch.tensor([[-3.0]])).item() == 2.0
