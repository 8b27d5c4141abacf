"""grpo export: a LoRA run's newest checkpoint as plain full weights that transformers loads, giving
the run's own log-probs (the trained adapters merged, not the base model's)."""

from __future__ import annotations

import json

import torch
from transformers import AutoModelForCausalLM

from grpo.cli import main
from grpo.models.logprobs import completion_logprobs
from grpo.serve.models import fallback_source, same_weights, source_of
from grpo.train.trainer import Trainer
from tests.test_trainer import make_cfg


def _logp(model, ro):
    model.eval()
    with torch.no_grad():
        return completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask,
                                   temperature=1.0)["logp"]  # [N, T]


def test_exported_lora_run_loads_in_transformers_with_the_runs_logprobs(tmp_path, tiny_model_dir, tiny_dataset):
    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, use_peft=True, lora_r=4, learning_rate=5e-2,
                   eval_prompts=0, max_steps=1, bf16=False, rollout_engine="hf")
    t = Trainer(cfg)
    t.train()
    assert (t.run_dir / "checkpoints" / "step-1" / "adapter_config.json").is_file()  # the run saved adapters only
    out = tmp_path / "exported"
    assert main(["export", str(t.run_dir), "--out", str(out)]) == 0
    assert not (out / "adapter_config.json").exists() and json.loads((out / "grpo_export.json").read_text())["lora_merged"]
    exported = AutoModelForCausalLM.from_pretrained(out)  # a plain model folder, no peft involved
    assert not any("lora" in k for k in exported.state_dict())
    _, ro = t.collector.sample(step=t.step, temperature=t.knobs.temperature)
    run_logp, exp_logp = _logp(t.policy, ro), _logp(exported, ro)
    base_logp = _logp(AutoModelForCausalLM.from_pretrained(tiny_model_dir), ro)
    mask = ro.completion_mask.bool()
    assert torch.allclose(exp_logp[mask], run_logp[mask], atol=1e-5)
    assert (base_logp[mask] - run_logp[mask]).abs().max() > 1e-3  # the adapters moved it: the merge matters
    assert main(["export", str(t.run_dir), "--out", str(out)]) == 2  # never over a folder with files
    # served, the folder stands for the run: its base model as the fallback (another model: the note is
    # due), the run's rewards behind the completeness check's default
    src = source_of(str(out))
    assert (src.weights, src.base, src.rewards) == (str(out), str(tiny_model_dir), cfg.rewards)
    assert not same_weights(src, fallback_source(src, "base"))
    plain = source_of(str(tiny_model_dir))  # a plain model is its own fallback: no note
    assert same_weights(plain, fallback_source(plain, "base")) and plain.rewards is None
