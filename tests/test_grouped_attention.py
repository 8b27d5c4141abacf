"""Grouped shared-prefix attention equals SDPA under the block mask, values and gradients, and the
policy's packed forwards run through it."""

import pytest
import torch
import torch.nn.functional as F

from grpo.models import grouped_attention
from grpo.models.grouped_attention import group_layout
from grpo.models.packing import packed_attention_mask


def test_group_layout_by_hand():
    seg = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, -1],  # prompt 3, completions of 2 and 3 tokens, padding
                        [0, 0, 1, 2, -1, -1, -1, -1, -1]])  # prompt 2, completions of 1 and 1 token
    a, b = group_layout(seg)
    assert a["prompt"] == 3 and a["index"].tolist() == [[3, 4, 3], [5, 6, 7]]
    assert a["valid"].tolist() == [[True, True, False], [True, True, True]]
    # completion 1, query 1 (column 4): every prompt key, its own keys 0 and 1, not its padding slot
    assert a["mask"][0, 0, 1].tolist() == [True, True, True, True, True, False]
    assert a["mask"][1, 0, 0].tolist() == [True, True, True, True, False, False]
    assert a["mask"][0, 0, 2].tolist() == [True, True, True, True, True, False]  # padded query: no empty row
    assert b["prompt"] == 2 and b["index"].tolist() == [[2], [3]] and b["mask"].shape == (2, 1, 1, 3)


ONE_BLOCK_PER_ROW = (torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 3, -1],
                                   [0, 0, 1, 1, 1, 1, 2, -1, -1, -1]]), None)
TWO_BLOCKS_IN_A_ROW = (torch.tensor([[0, 0, 1, 1, 0, 0, 0, 1, 2, 2],  # [prompt, c1 | prompt, c1, c2]
                                     [0, 0, 1, 1, 1, 2, -1, -1, -1, -1]]),
                       torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1, 1, 1],
                                     [0, 0, 0, 0, 0, 0, -1, -1, -1, -1]]))


def test_group_layout_of_a_row_with_two_blocks():
    seg, blocks = TWO_BLOCKS_IN_A_ROW
    a, b, c = group_layout(seg, blocks)
    assert (a["row"], a["start"], a["prompt"], a["index"].tolist()) == (0, 0, 2, [[2, 3]])
    assert (b["row"], b["start"], b["prompt"], b["index"].tolist()) == (0, 4, 3, [[7, 7], [8, 9]])
    assert b["columns"].tolist() == [7, 8, 9] and b["slots"].tolist() == [0, 2, 3]
    assert (c["row"], c["start"], c["prompt"]) == (1, 0, 2)


@pytest.mark.parametrize("layout", [ONE_BLOCK_PER_ROW, TWO_BLOCKS_IN_A_ROW], ids=["one-block", "two-blocks"])
def test_grouped_attention_equals_sdpa_under_the_block_mask(layout):
    """Two rows, GQA (4 query heads on 2 key-value heads): outputs at real columns and the gradients
    of q, k and v equal SDPA with packed_attention_mask's [R, 1, L, L] mask to 1e-5."""
    torch.manual_seed(0)
    seg, blocks = layout
    r, l, d = seg.shape[0], seg.shape[1], 8
    q0, k0, v0 = torch.randn(r, 4, l, d), torch.randn(r, 2, l, d), torch.randn(r, 2, l, d)
    real = (seg >= 0)[:, :, None, None]  # [R, L, 1, 1]

    def run(grouped: bool):
        q, k, v = (x.clone().requires_grad_() for x in (q0, k0, v0))
        if grouped:
            out = grouped_attention.grouped_attention(q, k, v, group_layout(seg, blocks), scaling=0.3)  # [R, L, Hq, D]
        else:
            mask = packed_attention_mask(seg, blocks, attn_implementation="sdpa", dtype=torch.float32)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3, enable_gqa=True).transpose(1, 2)
        out = out * real  # padding columns are not compared
        (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
        return out, q.grad, k.grad, v.grad

    for got, want in zip(run(True), run(False)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_policy_forwards_run_through_it_and_restore_the_model(tiny_model_dir, monkeypatch):
    """completion_logprobs with SDPA and shared prompts calls grouped_attention once per layer and puts
    the model's own attention implementation back."""
    from grpo.models import load_models
    from grpo.models.logprobs import completion_logprobs

    model = load_models(str(tiny_model_dir), need_reference=False).policy
    calls = []
    real = grouped_attention.grouped_attention
    monkeypatch.setattr(grouped_attention, "grouped_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    prompt = torch.tensor([[5, 6, 7]] * 2)
    comp = torch.tensor([[8, 9], [10, 0]])
    out = completion_logprobs(model, prompt, torch.ones_like(prompt), comp, torch.tensor([[1, 1], [1, 0]]),
                              temperature=1.0, share_prompt=True, attn_implementation="sdpa")
    assert len(calls) == model.config.num_hidden_layers
    assert model.config._attn_implementation == "sdpa"
    assert out["logp"].shape == (2, 2) and bool(torch.isfinite(out["logp"]).all())
