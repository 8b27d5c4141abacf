"""torch_compile=true: the compiled policy loss and advantages equal eager ones (loss and gradient to
1e-6, on two shapes: dynamic shapes, no recompile per shape), and a training step updates the
weights the same to 1e-6."""

import pytest
import torch

from grpo import core
from grpo.train.compiled import loss_and_advantage_functions

pytestmark = pytest.mark.slow  # Inductor compiles C++ on the first call


def _batch(n: int, t: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    theta = torch.randn(n, t, generator=gen).requires_grad_(True)
    old = -torch.nn.functional.softplus(theta.detach() + 0.2 * torch.randn(n, t, generator=gen))
    ref = -torch.nn.functional.softplus(theta.detach() + 0.2 * torch.randn(n, t, generator=gen))
    adv = torch.randn(n, 1, generator=gen).expand(n, t).contiguous()
    mask = (torch.arange(t)[None, :] < torch.randint(1, t + 1, (n, 1), generator=gen)).float()
    return theta, old, ref, adv, mask


@pytest.mark.parametrize("settings", [dict(), dict(kl_coef=0.04, eps_high=0.28, aggregation="token_mean")],
                         ids=["default", "kl-clip_higher-token_mean"])
def test_compiled_loss_and_gradient_equal_eager(settings):
    eager, _ = loss_and_advantage_functions(False)
    fast, _ = loss_and_advantage_functions(True)
    for n, t, seed in ((8, 12, 0), (16, 33, 1)):
        results = []
        for fn in (eager, fast):
            theta, old, ref, adv, mask = _batch(n, t, seed)
            logp = -torch.nn.functional.softplus(theta)  # [N, T]
            out = fn(logp, old, adv, mask, ref_logp=ref, **settings)
            out["loss"].backward()
            results.append((out, theta.grad.clone()))
        (a, ga), (b, gb) = results
        assert set(a) == set(b)
        for key in a:
            assert torch.allclose(a[key].detach(), b[key].detach(), atol=1e-6, rtol=1e-6), key
        assert (ga - gb).abs().max() <= 1e-6 * max(1.0, float(ga.abs().max()))


def test_compiled_advantages_equal_eager():
    _, eager = loss_and_advantage_functions(False)
    _, fast = loss_and_advantage_functions(True)
    for shape in ((4, 8), (6, 4)):
        r = torch.rand(shape, generator=torch.Generator().manual_seed(shape[0]))
        for est in ("grpo", "dr_grpo", "rloo"):
            assert torch.allclose(eager(r, estimator=est), fast(r, estimator=est), atol=1e-6, rtol=0)


def test_a_training_step_updates_the_same(tmp_path, tiny_model_dir, tiny_dataset, monkeypatch):
    """One step's batch, updated once with the eager loss and once, from the same weights and optimizer
    state, with the compiled one: the same gradient reaches the optimizer and the same weights result
    (to 1e-6), and the step did move them."""
    import grpo.train.update as update_module
    from grpo.train.trainer import Trainer
    from tests.test_trainer import make_cfg

    trainer = Trainer(make_cfg(tmp_path, tiny_model_dir, tiny_dataset, max_steps=1, eval_prompts=0, beta=0.04,
                               learning_rate=1e-4))
    samples, ro = trainer.collector.sample(step=trainer.step, temperature=trainer.knobs.temperature)
    rewards, _ = trainer.collector.score(samples, ro, step=trainer.step)
    batch, _ = trainer.prepare(ro, rewards, samples)
    grads, real_step = [], update_module.clipped_step
    monkeypatch.setattr(update_module, "clipped_step", lambda params, opt, **kw: (
        grads.append([p.grad.detach().clone() for p in params]), real_step(params, opt, **kw))[1])
    start = {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}
    opt_state = trainer.updater.optimizer.state_dict()
    results = []
    for fn in loss_and_advantage_functions(False)[0], loss_and_advantage_functions(True)[0]:
        trainer.policy.load_state_dict(start)
        trainer.updater.optimizer.load_state_dict(opt_state)
        trainer.updater._policy_loss = fn
        metrics = trainer.updater.update(batch, trainer.knobs, step=0)
        results.append((metrics, {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}))
    (m0, w0), (m1, w1) = results
    assert m0["loss"] == pytest.approx(m1["loss"], abs=1e-6) and m0["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-6)
    g_max = max(float(g.abs().max()) for g in grads[0])
    assert g_max > 0 and max(float((a - b).abs().max()) for a, b in zip(*grads)) <= 1e-6 * g_max
    assert max(float((w0[k] - start[k]).abs().max()) for k in start) > 1e-5  # the step moved the weights
    assert max(float((w0[k] - w1[k]).abs().max()) for k in start) <= 1e-6


def test_torch_compile_is_set_from_the_command_line_and_yaml(tmp_path):
    """torch_compile is also a TRL name: the key sets grpo's option (it compiles the loss and the
    advantages, not the model) wherever a config is read, instead of being refused as a TRL name."""
    from grpo.config import load_config

    assert load_config(overrides=["torch_compile=true"]).torch_compile is True
    (tmp_path / "c.yaml").write_text("torch_compile: true\n")
    assert load_config(str(tmp_path / "c.yaml")).torch_compile is True


_CROSS_ISA = r"""
import json, sys
import torch
sys.path.insert(0, sys.argv[1])
from torch._inductor.cpu_vec_isa import pick_vec_isa
from grpo.train.compiled import loss_and_advantage_functions
from tests.test_torch_compile import _batch

eager, _ = loss_and_advantage_functions(False)
fast, _ = loss_and_advantage_functions(True)
worst = 0.0
for n, t, seed in ((8, 12, 0), (16, 33, 1)):
    outs = []
    for fn in (eager, fast):
        theta, old, ref, adv, mask = _batch(n, t, seed)
        out = fn(-torch.nn.functional.softplus(theta), old, adv, mask, ref_logp=ref, kl_coef=0.04)
        out["loss"].backward()
        outs.append((out, theta.grad))
    (a, ga), (b, gb) = outs
    worst = max([worst, float((ga - gb).abs().max())] + [float((a[k].detach() - b[k].detach()).abs().max()) for k in a])
print(json.dumps({"isa": str(pick_vec_isa()), "worst": worst}))
"""


def test_kernels_compiled_for_another_instruction_set_are_not_read_back(tmp_path):
    """Two processes share one Inductor cache folder, the second with PyTorch capped at AVX2 (as
    bench/as_avx2.sh does): on a CPU with AVX-512 the first compiles AVX-512 kernels, which the
    second must not read back (they compute wrong results there); both equal eager to 1e-6. On a CPU
    without AVX-512 both compile for AVX2 and share the kernels, rightly."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    runs = []
    for cap in (env.get("ATEN_CPU_CAPABILITY"), "avx2"):
        run_env = {k: v for k, v in env.items() if k != "ATEN_CPU_CAPABILITY"} | ({"ATEN_CPU_CAPABILITY": cap} if cap else {})
        out = subprocess.run([sys.executable, "-c", _CROSS_ISA, root], env=run_env, capture_output=True, text=True,
                             timeout=900)
        assert out.returncode == 0, out.stderr[-2000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert all(r["worst"] <= 1e-6 for r in runs), runs
    folders = sorted(p.name for p in (tmp_path / "inductor").iterdir() if p.name.startswith("isa-"))
    assert folders == sorted({"isa-" + "+".join(r["isa"].split()) for r in runs}), folders


def test_the_kernel_cache_folder_is_named_by_the_instruction_set(tmp_path, monkeypatch):
    """The mechanism, on any CPU: compiling narrows Inductor's cache folder to the instruction set it
    compiles for, once (a second compile keeps the folder)."""
    import os

    from torch._inductor.cpu_vec_isa import pick_vec_isa

    from grpo.train.compiled import compiled

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    want = str(tmp_path / ("isa-" + "+".join(str(pick_vec_isa()).split())))
    compiled(torch.neg)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == want
    compiled(torch.abs)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == want
