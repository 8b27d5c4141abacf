"""The fused decode step computes what HF's decoder computes, step after step, on left-padded
prompts, for Llama and for Qwen2 (biases on q, k, v); and it declines the models it does not cover."""

import pytest
import torch

from grpo.rollout.fast import _buffer_cache
from grpo.rollout.fused import FusedDecoder, fused_unsupported_reason


def _tiny(kind: str):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    kw = dict(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128)
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**kw)).eval()
    return Qwen2ForCausalLM(Qwen2Config(**kw)).eval()


@pytest.mark.parametrize("onednn", [True, False])
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_fused_step_equals_hf_decoder_step(kind, onednn):
    model = _tiny(kind)
    dec = model.get_decoder()
    ids = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]])  # [2, 5] the first prompt left-padded
    mask = (torch.arange(5)[None] >= torch.tensor([[2], [0]])).long()  # [2, 5]
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    caches = [_buffer_cache(model, 12), _buffer_cache(model, 12)]
    with torch.no_grad():
        for c in caches:
            dec(input_ids=ids, attention_mask=mask, position_ids=pos, cache=c, use_cache=True)
        fused = FusedDecoder(model, packed=onednn)
        tok, nxt, attn = torch.tensor([9, 11]), pos[:, -1:] + 1, mask
        for _ in range(4):
            attn = torch.cat([attn, attn.new_ones(2, 1)], 1)
            want = dec(input_ids=tok[:, None], attention_mask=attn, position_ids=nxt, cache=caches[0],
                       use_cache=True).last_hidden_state[:, 0]  # [2, H]
            got = fused.step(tok, nxt, caches[1], attn)  # [2, H]
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            tok, nxt = (want @ model.lm_head.weight.T).argmax(-1), nxt + 1


def test_fused_declines_what_it_does_not_cover():
    model = _tiny("llama")
    assert fused_unsupported_reason(model, 64) is None
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(_tiny("llama"), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert "LoRA" in fused_unsupported_reason(lora.get_base_model(), 64)
    assert "float32" in fused_unsupported_reason(_tiny("llama").to(torch.bfloat16), 64)
    model.config.hidden_act = "gelu"
    assert "hidden_act" in fused_unsupported_reason(model, 64)
