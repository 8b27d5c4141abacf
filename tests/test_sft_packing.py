"""grpo sft's packing: the layout by hand, and the invariant that makes it safe: a packed batch's summed
loss and gradient equal those of the same examples one padded row each (attention kept inside each
example by position ids that restart at it), on the tiny random Llama. The guard that refuses packing
on a model whose attention leaks across examples is checked on a leaking forward (the KV cache on,
which switches transformers' packed-sequence mask off)."""

import pytest
import torch

from grpo.sft.batches import micro_batches, pack_groups, packed_batch, pad_batch, packing_isolated, summed_nll
from grpo.sft.data import SFTExample, encode_row
from tests.conftest import build_tokenizer

CHATS = [
    {"messages": [{"role": "system", "content": "Use calc."}, {"role": "user", "content": "What is 12 * 34?"},
                  {"role": "assistant", "content": "calc(12 * 34)"}, {"role": "tool", "content": "408"},
                  {"role": "assistant", "content": "12 * 34 = 408"}]},
    {"prompt": "What is 2 + 2?", "completion": "4"},
    {"prompt": "Name a colour.", "completion": "Blue"},
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"}]},
    {"prompt": "7 - 3?", "completion": "4, since 7 - 3 = 4"},
]


def test_first_fit_longest_first_by_hand():
    assert pack_groups([5, 3, 4, 2], 7) == [[0, 3], [2, 1]]
    assert pack_groups([7, 7], 7) == [[0], [1]]


def test_packed_row_by_hand():
    a = SFTExample([10, 11, 12], [False, True, True])
    b = SFTExample([20, 21], [True, True])  # its first token is never trained: nothing in b predicts it
    batch = packed_batch([[a, b], [b]], pad_id=0)
    assert batch["ids"].tolist() == [[10, 11, 12, 20, 21], [20, 21, 0, 0, 0]]
    assert batch["pos"].tolist() == [[0, 1, 2, 0, 1], [0, 1, 0, 1, 2]]
    assert batch["trained"].tolist() == [[False, True, True, False, True], [False, True, False, False, False]]


@pytest.fixture(scope="module")
def rows():
    tok = build_tokenizer()
    return [encode_row(tok, c, max_length=1000, where=f"row {n}") for n, c in enumerate(CHATS)]


def _loss_and_grad(model, batches) -> tuple[torch.Tensor, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    total = 0.0
    for b in batches:
        loss = summed_nll(model, b, autocast=False)
        loss.backward()
        total = total + loss.detach()
    return total, torch.cat([p.grad.flatten() for p in model.parameters()])


# the loss is summed in float32 (summed_nll), so even an fp64 model agrees to float32 rounding (8e-8
# relative measured at one seed); a leak across examples moves it by orders of magnitude more
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-6), (torch.float32, 2e-5)])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_loss_and_gradient_equal_unpacked(tiny_model_dir, rows, dtype, tol, attn):
    from transformers import AutoModelForCausalLM

    tok = build_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=dtype, attn_implementation=attn)
    longest = max(len(r.ids) for r in rows)
    packed = micro_batches(rows, micro=2, pad_id=tok.pad_token_id, packing=True, max_length=longest)
    examples_per_row = [int((b["pos"] == 0).sum(1).max()) for b in packed]
    assert max(examples_per_row) >= 3  # rows really hold several examples (and padding after them)
    assert all(b["ids"].shape[1] <= longest for b in packed)
    assert sum(int(b["trained"].sum()) for b in packed) == sum(sum(r.trained[1:]) for r in rows)
    loss_p, grad_p = _loss_and_grad(model, packed)
    loss_u, grad_u = _loss_and_grad(model, [pad_batch([r], tok.pad_token_id) for r in rows])
    torch.testing.assert_close(loss_p, loss_u, rtol=tol, atol=0)
    torch.testing.assert_close(grad_p, grad_u, rtol=tol, atol=tol * float(grad_u.abs().max()))


class _CachedForward(torch.nn.Module):
    """The model called with its KV cache on, as transformers does by default: the cache switches the
    packed-sequence mask off, so attention crosses the examples of a row."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, **kwargs):
        return self.model(**{**kwargs, "use_cache": True})


def test_packing_guard_accepts_the_model_and_refuses_a_leaking_forward(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    assert packing_isolated(model, model.config.vocab_size)
    assert not packing_isolated(_CachedForward(model), model.config.vocab_size)
