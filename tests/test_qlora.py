"""QLoRA (load_in_4bit): LoRA on a 4-bit NF4 base, the reference the quantized base with adapters off.
bitsandbytes' CPU backend runs 4-bit on this machine; a device it cannot use is a ConfigError.

QLoRA's gradients (Dettmers et al. 2023) must be those of a dense model holding the dequantized NF4
weights, also after a rollout: on a CPU with AVX512-BF16 bitsandbytes repacks a 4-bit layer for
inference at its first eval-mode no-grad forward, after which no gradient reaches the layer's input.
The gradient test compares against the dense model on such a CPU; the mechanism tests hold on any CPU
(they set the flag bitsandbytes sets on such a CPU)."""

import json

import pytest
import torch

from grpo.config import load_config
from grpo.errors import ConfigError
from grpo.models import load_models
from grpo.models.logprobs import completion_logprobs
from grpo.models.quantization import check_4bit, keep_trainable, nf4_layer, sequence_errors
from grpo.rollout import SamplingSettings, make_engine
from grpo.train.trainer import Trainer
from tests.conftest import TEST_SEED, build_tokenizer
from tests.test_trainer import make_cfg

bnb = pytest.importorskip("bitsandbytes")


def test_a_device_bitsandbytes_cannot_use_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match=r"^load_in_4bit: bitsandbytes \S+ cannot run 4-bit layers on device meta \("):
        check_4bit(torch.device("meta"))
    check_4bit(torch.device("cpu"))  # this machine's CPU backend: quantizes and multiplies within 4-bit error


def test_config_rules():
    with pytest.raises(ConfigError, match="^load_in_4bit: a 4-bit base cannot be trained itself; set use_peft=true"):
        load_config(None, ["load_in_4bit=true"])
    with pytest.raises(ConfigError, match="^load_in_4bit: rollout_engine fast does not sample a 4-bit model"):
        load_config(None, ["load_in_4bit=true", "use_peft=true", "rollout_engine=fast"])


def _frozen(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items() if "lora_" not in k}


def test_tiny_qlora_run(tmp_path, tiny_model_dir, tiny_dataset):
    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, use_peft=True, lora_r=4, lora_alpha=8, load_in_4bit=True,
                   beta=0.1, max_steps=3, learning_rate=5e-2, eval_prompts=0)
    t = Trainer(cfg)
    q = t.policy.base_model.model.model.layers[0].self_attn.q_proj
    assert isinstance(q.base_layer, bnb.nn.Linear4bit) and q.base_layer.weight.dtype == torch.uint8
    assert q.base_layer.weight.numel() * 2 == q.in_features * q.out_features  # two 4-bit codes per byte
    assert t.models.reference is None
    base_before = _frozen(t.policy)
    lora_before = {k: v.detach().clone() for k, v in t.policy.named_parameters() if v.requires_grad}
    t.train()
    lines = [json.loads(x) for x in (t.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["kl"] == pytest.approx(0.0, abs=1e-7)  # LoRA's B starts at 0: policy == quantized base
    assert lines[-1]["kl"] > 0 and {x["rollout_engine"] for x in lines} == {"hf"}  # auto: packed weights -> generate
    after = _frozen(t.policy)
    assert all(torch.equal(base_before[k], after[k]) for k in base_before)  # the 4-bit base never changes
    assert any(not torch.equal(v, dict(t.policy.named_parameters())[k]) for k, v in lora_before.items())
    # the reference is the quantized base with adapters off: a fresh 4-bit load gives the same logits
    ids = torch.tensor([[3, 5, 7, 11, 13]])
    fresh = load_models(str(tiny_model_dir), need_reference=False, load_in_4bit=True).policy
    with torch.no_grad(), t.policy.disable_adapter():
        ref = t.policy(input_ids=ids).logits
    with torch.no_grad():
        trained = t.policy(input_ids=ids).logits
        assert torch.equal(ref, fresh(input_ids=ids).logits) and not torch.allclose(ref, trained)


@pytest.fixture(scope="module")
def wide_model_dir(tmp_path_factory):
    """A tiny random Llama 64 wide: bitsandbytes' CPU repack needs 32-row blocks and 64-wide scale
    blocks, so every projection here (k and v: 32 rows) is one it would repack."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("wide-llama")
    tok = build_tokenizer()
    torch.manual_seed(TEST_SEED)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
                      tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _rollout(policy, tok):
    """Sample as a training step does (the hf engine: eval mode, no grad)."""
    sampling = SamplingSettings(max_new_tokens=6, temperature=1.0, max_prompt_length=1024)
    return make_engine("hf", policy, tok).generate(["What is 2 + 3?", "What is 4 + 1?"], group_size=2,
                                                   sampling=sampling, keys=[1, 2, 3, 4])


def _lora_grads(policy, ro) -> dict:
    """The adapters' gradients of a GRPO-shaped loss (advantages +-1) on the rollout, through the
    training forward (completion_logprobs), in train mode."""
    policy.train()
    policy.zero_grad()
    logp = completion_logprobs(policy, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask,
                               temperature=1.0)["logp"]  # [N, T]
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0])  # [N]
    (-(adv[:, None] * logp).sum()).backward()
    return {k: p.grad.clone() for k, p in policy.named_parameters() if p.requires_grad}


def test_lora_gradients_after_a_rollout_equal_the_dense_dequantized_models(wide_model_dir):
    """The same adapters on the 4-bit base and on a dense fp32 copy of its dequantized weights give the
    same gradients after a rollout, to fp32 rounding. On an AVX512-BF16 CPU without keep_trainable the
    rollout repacks every 4-bit layer and these gradients are off by 5 percent to twice their size."""
    tok = build_tokenizer()
    quant = load_models(str(wide_model_dir), need_reference=False, load_in_4bit=True, lora_r=4).policy
    dense = load_models(str(wide_model_dir), need_reference=False, lora_r=4).policy
    gen = torch.Generator().manual_seed(TEST_SEED)
    q_params, d_params = dict(quant.named_parameters()), dict(dense.named_parameters())
    q_modules = dict(quant.named_modules())
    with torch.no_grad():
        for k, p in q_params.items():
            if "lora_" in k:  # B nonzero too, so every adapter has a gradient that crosses the 4-bit layers
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
                d_params[k].copy_(p)
        n4 = 0
        for k, m in dense.named_modules():
            q = q_modules.get(k)
            if isinstance(q, bnb.nn.Linear4bit):
                m.weight.copy_(bnb.functional.dequantize_4bit(q.weight.data, q.weight.quant_state))
                n4 += 1
    assert n4 == 14  # 7 projections in each of 2 layers
    ro = _rollout(quant, tok)
    got, want = _lora_grads(quant, ro), _lora_grads(dense, ro)
    assert got.keys() == want.keys() and len(got) == 2 * n4  # A and B of every adapter
    assert all(want[k].norm() > 0 for k in want)
    errs = {k: float((got[k] - want[k]).norm() / want[k].norm()) for k in want}  # relative, per adapter matrix
    assert max(errs.values()) < 1e-5, sorted(errs.items(), key=lambda kv: -kv[1])[:4]


def test_no_4bit_layer_meets_the_repacking_conditions_during_a_rollout(wide_model_dir, monkeypatch):
    """On any CPU: with bitsandbytes' flag set as on an AVX512-BF16 CPU, a rollout runs every 4-bit
    layer on CPU in eval mode without grad (the repack's other conditions), and none with the flag."""
    monkeypatch.setattr(bnb.nn.modules, "has_avx512bf16", lambda: True)  # the flag every Linear4bit gets there
    policy = load_models(str(wide_model_dir), need_reference=False, load_in_4bit=True, lora_r=4).policy
    seen = []

    def record(layer, args):
        x = args[0]
        seen.append(dict(cpu=x.device.type == "cpu", flag=bool(layer.support_avx512bf16_for_cpu),
                         eval=not layer.training, no_grad=not x.requires_grad,
                         unpacked=not getattr(layer.weight.quant_state, "packing_format_for_cpu", False)))

    layers = [m for m in policy.modules() if isinstance(m, bnb.nn.Linear4bit)]
    hooks = [m.register_forward_pre_hook(record) for m in layers]
    try:
        _rollout(policy, build_tokenizer())
    finally:
        for h in hooks:
            h.remove()
    assert len(layers) == 14 and len(seen) >= 14
    assert all(s["cpu"] and s["eval"] and s["no_grad"] for s in seen)  # the sampling half of the conditions
    assert not any(all(s.values()) for s in seen), [s for s in seen if all(s.values())][:3]


@pytest.mark.filterwarnings("ignore:bitsandbytes::gemv_4bit")  # torch's warning about the repacked kernel
def test_the_probe_catches_a_layer_left_to_repack(monkeypatch):
    """On any CPU: a 4-bit layer whose repack flag is left set (as bitsandbytes sets it on an AVX512-BF16
    CPU) loses its input gradient after an eval no-grad forward; keep_trainable prevents it, refuses a
    layer already repacked, and check_4bit fails clearly where the guard does not hold."""
    gen = torch.Generator().manual_seed(0)
    w, x = torch.randn(64, 128, generator=gen), torch.randn(4, 128, generator=gen)  # [O, I], [R, I]
    guarded = nf4_layer(w, torch.device("cpu"))
    assert guarded.support_avx512bf16_for_cpu is False
    ok = sequence_errors(guarded, w, x)
    assert ok.gradient < 1e-5 and 0.01 < ok.output < 0.3  # fp32 rounding; NF4's rounding of the weight
    left = nf4_layer(w, torch.device("cpu"))
    left.support_avx512bf16_for_cpu = True  # what bitsandbytes sets on an AVX512-BF16 CPU
    assert sequence_errors(left, w, x).gradient == pytest.approx(1.0)  # no gradient reaches the input
    assert left.weight.quant_state.packing_format_for_cpu  # the eval no-grad forward repacked it
    with pytest.raises(ConfigError, match=r"^load_in_4bit: layer Linear4bit was repacked for CPU inference"):
        keep_trainable(left)
    monkeypatch.setattr(bnb.nn.modules, "has_avx512bf16", lambda: True)
    monkeypatch.setattr("grpo.models.quantization.keep_trainable", lambda model: 0)  # a guard that no longer holds
    with pytest.raises(ConfigError, match=r"^load_in_4bit: bitsandbytes \S+ on device cpu: after an eval-mode "
                                          r"forward without grad, a 4-bit layer's input gradient is off by 1 "):
        check_4bit(torch.device("cpu"))
