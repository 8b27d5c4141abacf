import pytest
import torch

from grpo.runtime import adamw

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])  # CI has no GPU


@pytest.mark.parametrize("device", DEVICES)
def test_adamw_is_fused_and_takes_the_foreach_step(device):
    """The fused AdamW makes the same update as the default implementation, to fp32 rounding, over
    several steps with weight decay (the state it saves has the same keys, so checkpoints carry over)."""
    torch.manual_seed(0)
    ours = [torch.randn(64, 32, device=device, requires_grad=True), torch.randn(32, device=device, requires_grad=True)]
    plain = [p.detach().clone().requires_grad_() for p in ours]
    opt = adamw(ours, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)
    ref = torch.optim.AdamW(plain, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1, foreach=True)
    assert opt.defaults["fused"] is True
    for _ in range(4):
        for p, q in zip(ours, plain):
            g = torch.randn_like(p)
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
    for p, q in zip(ours, plain):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)
    assert opt.state_dict()["state"][0].keys() == ref.state_dict()["state"][0].keys()


def test_adamw_falls_back_where_fused_is_not_supported():
    """Meta tensors (no kernel runs on them) get the default implementation instead of an error."""
    assert not adamw([torch.zeros(3, device="meta", requires_grad=True)], lr=1e-3).defaults["fused"]
