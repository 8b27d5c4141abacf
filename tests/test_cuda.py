"""The same computations on a CUDA device as on the CPU (skipped where there is no GPU: CI has none).

Each test runs one piece on both devices and compares: the keyed noise stream, grouped attention, a
rollout, and whole training steps in fp32; then bf16 autocast steps on the GPU. (The fused AdamW
step's test, tests/test_runtime.py, also runs on CUDA where there is a GPU.)
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from grpo.config import Config
from grpo.models import load_models
from grpo.rollout import fast_rollout, generate_rollout
from grpo.rollout.keys import keyed_gumbel, row_base, row_keys
from grpo.train.trainer import Trainer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_keyed_noise_is_the_same_stream_on_cuda():
    """The int64 splitmix stream wraps the same way on the GPU: the same uniforms, so the same draws."""
    bases = [row_base(k, t) for k in (0, 1, 2**40 + 3) for t in (0, 5, 63)]
    cpu = keyed_gumbel(bases, 4099)  # [9, V]
    gpu = keyed_gumbel(bases, 4099, "cuda").cpu()
    torch.testing.assert_close(gpu, cpu, rtol=1e-6, atol=1e-6)


def test_grouped_attention_on_cuda_equals_cpu():
    from grpo.models import grouped_attention
    from grpo.models.grouped_attention import group_layout

    torch.manual_seed(0)
    seg = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 3, -1], [0, 0, 1, 1, 1, 1, 2, -1, -1, -1]])
    q0, k0, v0 = torch.randn(2, 4, 10, 8), torch.randn(2, 2, 10, 8), torch.randn(2, 2, 10, 8)

    def run(device):
        q, k, v = (x.to(device).requires_grad_() for x in (q0, k0, v0))
        out = grouped_attention.grouped_attention(q, k, v, group_layout(seg.to(device)), scaling=0.3)
        out = out * (seg.to(device) >= 0)[:, :, None, None]  # [R, L, Hq, D], padding not compared
        (out * torch.linspace(-1, 1, out.numel(), device=device).view(out.shape)).sum().backward()
        return [t.detach().cpu() for t in (out, q.grad, k.grad, v.grad)]

    for got, want in zip(run("cuda"), run("cpu")):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_rollout_on_cuda_draws_the_cpu_tokens(tiny_model_dir):
    """The fast backend on a GPU (HF's decoder step; the fused CPU steps decline it) draws the tokens
    the CPU draws and generate draws there, with the same sampling log-probs. (Exact equality relies
    on no two perturbed logits tying within the devices' rounding, ~1e-6: true of this seed.)"""
    m = load_models(str(tiny_model_dir), need_reference=False)
    prompts = ["What is 1 + 1?", "Hi", "x"]
    kw = dict(group_size=4, max_new_tokens=10, temperature=0.9, top_k=20, top_p=0.95,
              keys=row_keys(1, 2, 0, len(prompts) * 4))
    cpu = fast_rollout(m.policy, m.tokenizer, prompts, **kw)
    model = m.policy.to("cuda")
    gpu = fast_rollout(model, m.tokenizer, prompts, **kw)
    ref = generate_rollout(model, m.tokenizer, prompts, **kw)
    for other in (gpu, ref):
        assert torch.equal(other.completion_ids.cpu(), cpu.completion_ids)
        torch.testing.assert_close(other.sampling_logp.cpu(), cpu.sampling_logp, atol=1e-4, rtol=0)


def _cfg(tmp_path, model_dir, dataset, name, **kw) -> Config:
    base = dict(model=str(model_dir), task=str(dataset), output_dir=str(tmp_path / name), max_steps=2,
                num_generations=4, prompts_per_step=2, per_device_train_batch_size=4, max_completion_length=8,
                eval_prompts=0, rewards="tests.rewards_for_tests:digit_share", learning_rate=1e-3, beta=0.04,
                num_iterations=2, temperature=1.0, progress=False, report_to="none", seed=0, reward_timeout=0.0,
                bf16=False)
    base.update(kw)
    return Config(**base)


def _train(cfg) -> tuple[Trainer, list[dict]]:
    t = Trainer(cfg)
    t.train()
    return t, [json.loads(line) for line in (t.run_dir / "metrics.jsonl").read_text().splitlines()]


def test_training_steps_on_cuda_match_cpu(tmp_path, tiny_model_dir, tiny_dataset, monkeypatch):
    """Two fp32 steps (mu = 2, beta > 0, shared prefix) on the GPU: the same draws, metrics to 1e-4
    relative and weights to 1e-5 as on the CPU."""
    gpu, gpu_lines = _train(_cfg(tmp_path, tiny_model_dir, tiny_dataset, "gpu"))
    assert next(gpu.policy.parameters()).device.type == "cuda" and not gpu.placement.amp
    with monkeypatch.context() as mp:
        mp.setattr(torch.cuda, "is_available", lambda: False)
        cpu, cpu_lines = _train(_cfg(tmp_path, tiny_model_dir, tiny_dataset, "cpu"))
    assert next(cpu.policy.parameters()).device.type == "cpu"
    for g, c in zip(gpu_lines, cpu_lines, strict=True):
        for key in ("reward_mean", "completion_length_mean", "loss", "kl", "entropy", "grad_norm", "ratio_mean"):
            assert math.isclose(g[key], c[key], rel_tol=1e-4, abs_tol=1e-6), (key, g[key], c[key])
    gpu_w = {k: v.detach().cpu() for k, v in gpu.policy.state_dict().items()}
    for k, v in cpu.policy.state_dict().items():
        torch.testing.assert_close(gpu_w[k], v, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("use_peft", [False, True])
def test_bf16_autocast_steps_on_cuda(tmp_path, tiny_model_dir, tiny_dataset, use_peft):
    """bf16 autocast (the default where the GPU has native bf16): weights and the output layer stay
    fp32, every logged quantity is finite and the trainable weights move."""
    t = Trainer(_cfg(tmp_path, tiny_model_dir, tiny_dataset, "amp", bf16=None, use_peft=use_peft, lora_r=4))
    assert t.placement.amp and t.policy.get_output_embeddings()._grpo_fp32  # models.keep_head_fp32 ran
    before = {k: p.detach().clone() for k, p in t.policy.named_parameters() if p.requires_grad}
    t.train()
    lines = [json.loads(line) for line in (t.run_dir / "metrics.jsonl").read_text().splitlines()]
    for line in lines:
        for key in ("loss", "kl", "entropy", "grad_norm", "reward_mean"):
            assert math.isfinite(line[key]), (key, line)
    after = dict(t.policy.named_parameters())
    assert all(p.dtype == torch.float32 for p in after.values())
    assert any(not torch.equal(before[k], after[k]) for k in before)
