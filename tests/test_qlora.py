"""QLoRA (load_in_4bit): LoRA on a 4-bit NF4 base, the reference the quantized base with adapters off.
bitsandbytes' CPU backend runs 4-bit on this machine; a device it cannot use is a ConfigError."""

import json

import pytest
import torch

from grpo.config import load_config
from grpo.errors import ConfigError
from grpo.models import load_models
from grpo.models.quantization import check_4bit
from grpo.train.trainer import Trainer
from tests.test_trainer import make_cfg

bnb = pytest.importorskip("bitsandbytes")


def test_a_device_bitsandbytes_cannot_use_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match=r"^load_in_4bit: bitsandbytes \S+ cannot run 4-bit layers on device meta \("):
        check_4bit(torch.device("meta"))
    check_4bit(torch.device("cpu"))  # this machine's CPU backend: quantizes and multiplies within 4-bit error


def test_config_rules():
    with pytest.raises(ConfigError, match="^load_in_4bit: a 4-bit base cannot be trained itself; set use_peft=true"):
        load_config(None, ["load_in_4bit=true"])
    with pytest.raises(ConfigError, match="^load_in_4bit: rollout_backend fast does not sample a 4-bit model"):
        load_config(None, ["load_in_4bit=true", "use_peft=true", "rollout_backend=fast"])


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
    assert lines[-1]["kl"] > 0 and {x["rollout_backend"] for x in lines} == {"hf"}  # auto: packed weights -> generate
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
