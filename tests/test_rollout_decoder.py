"""The fused decode steps (PyTorch small ops, and the C small ops of native.py) compute what HF's
decoder computes, step after step, on left-padded prompts shared by G rows, as rows leave the batch,
for Llama and for Qwen2 (biases on q, k, v); and they decline the models they do not cover."""

import pytest
import torch

from grpo.rollout import native
from grpo.rollout.fast import _buffer_cache, cache_keyword
from grpo.rollout.decoder import TorchDecoder, decoder_unsupported_reason
from grpo.rollout.tuning import PRODUCTS
from tests.conftest import need_native


def _tiny(kind: str):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    kw = dict(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128)
    if kind == "llama-d16":  # head dim 16: the C attention's 16-lane blocks (8 runs its one-by-one tail)
        return LlamaForCausalLM(LlamaConfig(**{**kw, "hidden_size": 64})).eval()
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**kw)).eval()
    return Qwen2ForCausalLM(Qwen2Config(**kw)).eval()


def _decoder(kind: str, model, onednn: bool):
    if kind == "torch":
        return TorchDecoder(model, packed=onednn)
    need_native()
    lib = native.library()
    if kind == "native-serial":  # the build without OpenMP: attention's rows on one thread
        lib = native.load(native.built(native.compiler(), native.serial_flags()))
        assert lib.attention_threads() == 1
    if kind == "native-panels":  # every product through decode_ops.c's panel_linear (4 rows, then 3: padded to 8)
        panel = PRODUCTS["panel"].make
        dec = native.NativeDecoder(model, lib, linears=dict.fromkeys(("qkv", "o", "gate_up", "down"), panel))
        assert all("panel_product" in w[k].__qualname__ for w in dec.layers for k in ("qkv", "o", "gate_up", "down"))
        return dec
    return native.NativeDecoder(model, lib, packed=onednn)


@pytest.mark.parametrize("step_kind", ["torch", "native", "native-serial", "native-panels"])
@pytest.mark.parametrize("onednn", [True, False])
@pytest.mark.parametrize("kind", ["llama", "llama-d16", "qwen2"])
def test_fused_step_equals_hf_decoder_step(kind, onednn, step_kind):
    """Two prompts (one left-padded) x 2 rows each, 5 decode steps; after the third, row 1 ends and
    leaves the batch. Every step's hidden states equal HF's decoder on its own (repeated) cache.
    (native: 4 rows split over OpenMP's threads, then 3 rows on one.)"""
    model = _tiny(kind)
    dec = model.get_decoder()
    ids = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]])  # [2, 5] the first prompt left-padded
    mask = (torch.arange(5)[None] >= torch.tensor([[2], [0]])).long()  # [2, 5]
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    g = 2
    caches = [_buffer_cache(model, 12), _buffer_cache(model, 12)]
    kw = cache_keyword(dec)  # cache (transformers 5.24), past_key_values (5.17)
    with torch.no_grad():
        for c in caches:
            dec(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{kw: c})
        caches[0].batch_repeat_interleave(g)
        fused = _decoder(step_kind, model, onednn)
        fused.start(caches[1], mask, g, 7)
        rows, tok = torch.arange(4), torch.tensor([9, 11, 12, 13])
        nxt, attn = pos[:, -1:].repeat_interleave(g, 0) + 1, mask.repeat_interleave(g, 0)
        for t in range(5):
            attn = torch.cat([attn, attn.new_ones(attn.shape[0], 1)], 1)
            want = dec(input_ids=tok[:, None], attention_mask=attn, position_ids=nxt, use_cache=True,
                       **{kw: caches[0]}).last_hidden_state[:, 0]  # [n, H]
            got = fused.step(tok, nxt, rows)  # [n, H]
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            tok, nxt = (want @ model.lm_head.weight.T).argmax(-1), nxt + 1
            if t == 2:  # row 1 ends: the reference drops its cache row, the decoder is told by `rows`
                keep = torch.tensor([0, 2, 3])
                caches[0].batch_select_indices(keep)
                rows, tok, nxt, attn = rows[keep], tok[keep], nxt[keep], attn[keep]


def test_native_library_is_rebuilt_into_a_fresh_cache(tmp_path, monkeypatch):
    """With an empty cache folder the C file is compiled there (and loads); GRPO_NATIVE=0 turns it off."""
    need_native()
    monkeypatch.setenv("GRPO_CACHE", str(tmp_path))
    native.load_library.cache_clear()
    try:
        assert native.library() is not None, native.unavailable_reason()
        assert len(list(tmp_path.glob("decode_ops-*.so"))) == 1
        # built with OpenMP, on PyTorch's runtime: its threads
        assert native.library().attention_threads() == torch.get_num_threads()
        native.load_library.cache_clear()
        monkeypatch.setenv("GRPO_NATIVE", "0")
        assert native.library() is None and native.unavailable_reason() == "GRPO_NATIVE=0"
    finally:
        native.load_library.cache_clear()


def test_fused_declines_what_it_does_not_cover():
    model = _tiny("llama")
    assert decoder_unsupported_reason(model, 64) is None
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(_tiny("llama"), LoraConfig(r=2, target_modules=["q_proj", "v_proj"], use_dora=True))
    assert "LoRA" in decoder_unsupported_reason(lora.get_base_model(), 64)  # DoRA is not W + B A
    assert "float32" in decoder_unsupported_reason(_tiny("llama").to(torch.bfloat16), 64)
    model.config.hidden_act = "gelu"
    assert "hidden_act" in decoder_unsupported_reason(model, 64)


@pytest.mark.parametrize("step_kind", ["torch", "native"])
def test_fused_step_of_a_lora_policy_equals_its_peft_forward(step_kind):
    """A LoRA policy (adapters with non-zero B, so they change the output) steps through the fused
    decoder with the adapters merged into its weights: the hidden states equal the PEFT model's
    own decoder step, and with the adapters disabled those of the base model."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_tiny("llama"), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    torch.manual_seed(1)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.5)
    base = model.get_base_model().eval()
    assert decoder_unsupported_reason(base, 64) is None
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    for disabled in (False, True):
        ctx = model.disable_adapter() if disabled else torch.enable_grad()
        with ctx, torch.no_grad():
            caches = [_buffer_cache(base, 12), _buffer_cache(base, 12)]
            dec = base.get_decoder()
            for c in caches:
                dec(input_ids=ids, use_cache=True, **{cache_keyword(dec): c})
            fused = _decoder(step_kind, base, True)
            fused.start(caches[1], torch.ones_like(ids), 1, 7)
            tok, pos = torch.tensor([7]), torch.tensor([[5]])
            want = dec(input_ids=tok[:, None], position_ids=pos, use_cache=True,
                       **{cache_keyword(dec): caches[0]}).last_hidden_state[:, 0]
            torch.testing.assert_close(fused.step(tok, pos, torch.arange(1)), want, atol=1e-5, rtol=1e-5)
        if not disabled:
            lora_out = want
    assert (lora_out - want).abs().max() > 1e-2  # the adapters did change the step
