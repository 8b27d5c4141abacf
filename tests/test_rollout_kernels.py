"""oneDNN packed linears for decoding: the same fp32 products to rounding, and the model's own
forwards (including wrappers set on an instance, as keep_head_fp32 does) back after the block."""

import pytest
import torch

from grpo.rollout.kernels import head_chunks, onednn_available, packed_linears


@pytest.mark.skipif(not onednn_available(), reason="torch built without oneDNN")
def test_packed_linears_compute_the_same_products_and_restore_forwards():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 80, bias=False))
    bf16 = torch.nn.Linear(8, 8).to(torch.bfloat16)
    wrapper = lambda x: net[2].__class__.forward(net[2], x) * 1.0  # an instance-level forward, as keep_head_fp32
    net[2].forward = wrapper
    x = torch.randn(8, 64)  # [n, in]: a decode batch of 8 rows
    with torch.no_grad():
        want = net(x)
        with packed_linears(torch.nn.ModuleList([net, bf16])) as patched:
            got = net(x)
            assert patched == {net[0], net[2]}  # the bf16 layer is left alone
            assert got.shape == (8, 80)
    # fp32 sums in another order: |error| ~ eps * sqrt(64 + 96) * |terms|, far below 1e-4
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
    assert "forward" not in vars(net[0]) and net[2].forward is wrapper


def test_head_chunks_give_bitwise_the_same_logits():
    head = torch.nn.Linear(16, 5000)
    h = torch.randn(8, 16)
    chunks = head_chunks(head.weight, head.bias)
    assert len(chunks) == 3  # 2048 + 2048 + 904 rows
    with torch.no_grad():
        blocked = torch.cat([torch.nn.functional.linear(h, w, b) for w, b in chunks], 1)
        assert torch.equal(blocked, head(h))
