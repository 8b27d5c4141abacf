"""Completion log-probs: packed rows without padding work, and shared-prefix training (the G
completions of a group share one prompt pass) equal to the plain per-sequence computation, in value
and in gradient, to 1e-5."""

import pytest
import torch

from grpo.models.logprobs import completion_logprobs
from grpo.models.packing import pack_sequences
from tests.conftest import build_tiny_model


def _batch(seed: int = 0, groups=((3, 5), (6, 4), (2, 3)), vocab: int = 40, t: int = 7):
    """Left-padded prompts [N, P] and right-padded completions [N, T]: group b has a prompt of
    groups[b][0] tokens and groups[b][1] completions of varied lengths (one of them full length)."""
    g = torch.Generator().manual_seed(seed)
    p_max = max(p for p, _ in groups)
    prompt_ids, prompt_mask, comp_ids, comp_mask = [], [], [], []
    for p, n_comp in groups:
        prompt = torch.randint(1, vocab, (p,), generator=g)
        for j in range(n_comp):
            prompt_ids.append(torch.cat([torch.zeros(p_max - p, dtype=torch.long), prompt]))
            prompt_mask.append(torch.cat([torch.zeros(p_max - p), torch.ones(p)]).long())
            length = t if j == 0 else int(torch.randint(1, t + 1, (1,), generator=g))
            comp_ids.append(torch.where(torch.arange(t) < length, torch.randint(1, vocab, (t,), generator=g), 0))
            comp_mask.append((torch.arange(t) < length).long())
    return [torch.stack(x) for x in (prompt_ids, prompt_mask, comp_ids, comp_mask)]


def _one_by_one(model, batch, temperature):
    """Reference: each sequence alone, its real tokens only, through the plain model and log_softmax."""
    prompt_ids, prompt_mask, comp_ids, comp_mask = batch
    logps, ents = [], []
    for i in range(len(prompt_ids)):
        prompt = prompt_ids[i][prompt_mask[i].bool()]
        m = int(comp_mask[i].sum())
        ids = torch.cat([prompt, comp_ids[i, :m]])[None]  # [1, P + m]
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1] / temperature  # [m, V]
        ls = torch.log_softmax(logits, -1)
        lp = torch.zeros(comp_ids.shape[1])
        ent = torch.zeros(comp_ids.shape[1])
        lp[:m] = ls.gather(1, comp_ids[i, :m, None])[:, 0]
        ent[:m] = -(ls.exp() * ls).sum(-1)
        logps.append(lp)
        ents.append(ent)
    return torch.stack(logps), torch.stack(ents)


def _grads(model, logp, ent, w1, w2):
    model.zero_grad(set_to_none=True)
    ((logp * w1).sum() + (ent * w2).sum()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("share,max_row_tokens", [(False, 0), (True, 0), (True, 21)])
def test_packed_logprobs_and_gradients_equal_one_sequence_at_a_time(attn, share, max_row_tokens):
    """Every group in one row (max_row_tokens 0), or rows of at most 21 tokens: the first group split
    over rows, and one row with two groups' blocks."""
    model = build_tiny_model(40, seed=1).double()  # float64: the check is of the layout, not of rounding
    model.config._attn_implementation = attn
    batch = _batch()
    w1, w2 = torch.randn(2, *batch[2].shape, generator=torch.Generator().manual_seed(3)).double()
    ref_lp, ref_ent = _one_by_one(model, batch, 0.7)
    g_ref = _grads(model, ref_lp, ref_ent, w1, w2)
    out = completion_logprobs(model, *batch, temperature=0.7, with_entropy=True, share_prompt=share,
                              attn_implementation=attn, max_row_tokens=max_row_tokens)
    torch.testing.assert_close(out["logp"], ref_lp.to(out["logp"].dtype), atol=1e-5, rtol=0)
    torch.testing.assert_close(out["entropy"], ref_ent.to(out["entropy"].dtype), atol=1e-5, rtol=0)
    g = _grads(model, out["logp"].double(), out["entropy"].double(), w1, w2)
    for name, grad in g_ref.items():
        torch.testing.assert_close(g[name], grad, atol=1e-5, rtol=0, msg=name)


def test_shared_prefix_in_float32_matches_per_sequence_to_1e5():
    """The setting the trainer runs: float32, SDPA, gradients of every parameter."""
    model = build_tiny_model(40, seed=2)
    batch = _batch(seed=4)
    w = torch.randn(batch[2].shape, generator=torch.Generator().manual_seed(5))
    plain = completion_logprobs(model, *batch, temperature=1.0, share_prompt=False)["logp"]
    g_plain = _grads(model, plain, torch.zeros_like(plain), w, 0)
    shared = completion_logprobs(model, *batch, temperature=1.0, share_prompt=True)["logp"]
    g_shared = _grads(model, shared, torch.zeros_like(shared), w, 0)
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=0)
    for name in g_plain:
        torch.testing.assert_close(g_shared[name], g_plain[name], atol=1e-5, rtol=0, msg=name)


def test_shared_prefix_packs_groups_into_rows_of_real_tokens():
    batch = _batch(groups=((3, 2), (2, 2)), t=4)
    l0, l1, l2, l3 = batch[3].sum(1).tolist()
    pk = pack_sequences(*batch, share_prompt=True)
    # one row, two blocks: [prompt 3, c0, c1 | prompt 2, c2, c3], real tokens only
    second = 3 + l0 + l1
    assert pk["input_ids"].shape == (1, second + 2 + l2 + l3)
    assert pk["blocks"][0].tolist() == [0] * second + [1] * (2 + l2 + l3)
    assert pk["segments"][0].tolist() == [0] * 3 + [1] * l0 + [2] * l1 + [0] * 2 + [1] * l2 + [2] * l3
    assert pk["input_ids"][0, 3:3 + l0].tolist() == batch[2][0, :l0].tolist()
    assert pk["input_ids"][0, second:second + 2].tolist() == batch[0][2, -2:].tolist()
    # positions restart after each block's prompt for each completion, and from 0 for each block
    assert pk["position_ids"][0, 3 + l0].item() == 3 and pk["position_ids"][0, second].item() == 0
    # a group's first tokens are all scored at its prompt's last position
    assert pk["index"][0, 0] == pk["index"][1, 0] and pk["index"][2, 0] == pk["index"][3, 0]
    # only the scoring columns reach the LM head: each prompt's last, each completion's but its last
    want = [2, *range(3, 3 + l0 - 1), *range(3 + l0, second - 1), second + 1,
            *range(second + 2, second + 2 + l2 - 1), *range(second + 2 + l2, second + 2 + l2 + l3 - 1)]
    assert pk["logits_to_keep"].tolist() == sorted(set(want))
    valid = pk["index"][pk["valid"]]
    assert len(set(valid.tolist())) == len(valid) - 2  # every other scored token has its own position
    unshared = pack_sequences(*batch, share_prompt=False)
    assert unshared["input_ids"].shape[0] == 4 and int(unshared["blocks"].max()) == 0
    assert len(set(unshared["index"][unshared["valid"]].tolist())) == l0 + l1 + l2 + l3
    # a row capped at the first group's block: the second group starts a new row
    capped = pack_sequences(*batch, share_prompt=True, max_row_tokens=second)
    assert capped["input_ids"].shape[0] == 2 and int(capped["blocks"].max()) == 0
    # completions of 4, 1 | 1, 3 tokens in rows of at most 7: [p0 c0], [p0 c1 p1 c2], [p1 c3]; the
    # first group's second completion starts a row with its prompt again, the second group's block follows
    lengths = torch.tensor([4, 1, 1, 3])
    mask = (torch.arange(4) < lengths[:, None]).long()
    capped = pack_sequences(batch[0], batch[1], batch[2] * mask, mask, share_prompt=True, max_row_tokens=7)
    assert capped["blocks"].tolist() == [[0] * 7, [0, 0, 0, 0, 1, 1, 1], [0] * 5 + [-1] * 2]
    assert capped["segments"].tolist() == [[0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 0, 0, 1], [0, 0, 1, 1, 1, -1, -1]]
    assert capped["input_ids"][1, :3].tolist() == batch[0][1, -3:].tolist()
    assert capped["input_ids"][2, :2].tolist() == batch[0][2, -2:].tolist()


def test_bad_masks_are_clear_errors():
    prompt_ids, prompt_mask, comp_ids, comp_mask = _batch(groups=((3, 2),), t=4)
    holed = comp_mask.clone()
    holed[0] = torch.tensor([1, 0, 1, 1])
    with pytest.raises(ValueError, match="completion_mask"):
        pack_sequences(prompt_ids, prompt_mask, comp_ids, holed, share_prompt=True)
    with pytest.raises(ValueError, match="prompt_mask"):
        pack_sequences(prompt_ids, torch.zeros_like(prompt_mask), comp_ids, comp_mask, share_prompt=True)


def test_empty_completions_give_zero_logprobs():
    model = build_tiny_model(40, seed=1)
    prompt_ids, prompt_mask, comp_ids, comp_mask = _batch(groups=((3, 2),), t=4)
    out = completion_logprobs(model, prompt_ids, prompt_mask, comp_ids * 0, comp_mask * 0, temperature=1.0,
                              share_prompt=True)
    assert torch.equal(out["logp"], torch.zeros(2, 4))


def test_flash_attention_is_refused_for_shared_prefix():
    from grpo.models.packing import packed_attention_mask

    seg = torch.tensor([[0, 0, 1, 1, 2, -1]])
    with pytest.raises(ValueError, match="flash_attention_2"):
        packed_attention_mask(seg, attn_implementation="flash_attention_2", dtype=torch.float32)
    assert packed_attention_mask(seg[:, :4], attn_implementation="flash_attention_2", dtype=torch.float32).dim() == 2


@pytest.mark.parametrize("share", [False, True])
def test_tied_embedding_grad_in_place_gives_the_same_dense_gradient(share):
    """The tied embedding's gradient added in place into .grad, with the output layer's through
    autograd, is the dense gradient of the plain backward (to fp32 rounding), over two accumulated
    backward passes, with a padding_idx whose row gets none; the module's own forward is back after."""
    from grpo.models.logprobs import tied_embedding_grad_in_place

    model = build_tiny_model(40, seed=4)
    model.get_input_embeddings().padding_idx = 3
    batch = _batch(seed=2)
    w = torch.randn(batch[2].shape, generator=torch.Generator().manual_seed(6))

    def grads(in_place: bool):
        model.zero_grad(set_to_none=True)
        for half in (slice(0, 7), slice(7, None)):  # two passes accumulate into the same gradients
            with tied_embedding_grad_in_place(model, enabled=in_place) as used:
                out = completion_logprobs(model, *(x[half] for x in batch), temperature=0.7, share_prompt=share)
            assert used == in_place
            (out["logp"] * w[half]).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    plain, in_place = grads(False), grads(True)
    assert "forward" not in vars(model.get_input_embeddings())
    assert bool((batch[0] == 3).any() | (batch[2] == 3).any())  # the padding row's token occurs
    for name, g in in_place.items():
        assert g.layout == torch.strided, name  # dense: what clipping and the fused AdamW take
        torch.testing.assert_close(g, plain[name], rtol=1e-5, atol=1e-7)


def test_tied_embedding_grad_in_place_leaves_untied_and_frozen_embeddings_alone():
    from transformers import LlamaConfig, LlamaForCausalLM

    from grpo.models.logprobs import tied_embedding_grad_in_place

    untied = LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                          num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False))
    frozen = build_tiny_model(40)
    frozen.get_input_embeddings().weight.requires_grad_(False)
    for model in (untied, frozen):
        with tied_embedding_grad_in_place(model) as used:
            assert not used and "forward" not in vars(model.get_input_embeddings())
