import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo.train.optim import Schedule, adamw, lr_lambda

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])  # CI has no GPU


@pytest.mark.parametrize("device", DEVICES)
def test_adamw_is_fused_and_takes_the_foreach_step(device):
    """The fused AdamW makes the same update as the default implementation, to fp32 rounding, over
    several steps with weight decay (the state it saves has the same keys, so checkpoints carry over)."""
    torch.manual_seed(0)
    ours = [torch.randn(64, 32, device=device, requires_grad=True), torch.randn(32, device=device, requires_grad=True)]
    plain = [p.detach().clone().requires_grad_() for p in ours]
    opt = adamw(ours, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)
    ref = torch.optim.AdamW(plain, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1, foreach=True)
    assert opt.defaults["fused"] is True
    for _ in range(4):
        for p, q in zip(ours, plain):
            g = torch.randn_like(p)
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
    for p, q in zip(ours, plain):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)
    assert opt.state_dict()["state"][0].keys() == ref.state_dict()["state"][0].keys()


def test_adamw_falls_back_where_fused_is_not_supported():
    """Meta tensors (no kernel runs on them) get the default implementation instead of an error."""
    assert not adamw([torch.zeros(3, device="meta", requires_grad=True)], lr=1e-3).defaults["fused"]


def test_warmup_and_decay_are_counted_in_training_steps():
    """max_steps=4, warmup_steps=1, num_iterations=2: 8 optimizer steps, the first 2 warm up (1/3, 2/3),
    then linear decay over the other 6: 1, 5/6, 4/6, ..., 1/6."""
    f = lr_lambda(Schedule(lr_scheduler_type="linear", warmup_steps=1, max_steps=4), per_step=2)
    assert [f(k) for k in range(8)] == pytest.approx([1 / 3, 2 / 3, 1, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6])
    cos = lr_lambda(Schedule(lr_scheduler_type="cosine", warmup_steps=0, max_steps=3), per_step=1)
    assert [cos(k) for k in range(3)] == pytest.approx([1.0, 0.75, 0.25])  # (1 + cos(pi k / 3)) / 2



_FAULTS = """
import ctypes, resource, sys, torch
ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE: 4 KiB pages, whatever the system's THP setting
from grpo.infra.runtime import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
torch.manual_seed(0)
w = torch.randn(1024, 4096, requires_grad=True)  # [D, F]
x = torch.randn(2048, 1024)  # [N, D]: the [N, F] activations are 32 MiB each
def faults_of_a_step():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    (torch.relu(x @ w) @ w.T).square().mean().backward()
    w.grad = None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(*[faults_of_a_step() for _ in range(10)])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_keep_freed_memory_stops_page_faults_once_the_heap_has_grown():
    """A small training step repeated: under glibc's default settings every step maps its large
    temporaries afresh and faults their pages in (~20k faults a step here); after keep_freed_memory()
    a step mostly reuses the memory the steps before it freed. Each run is its own process: the setting is
    process-wide. Transparent huge pages are off in that process, so a fault is one 4 KiB page wherever
    the system enables them (with THP "always", a 32 MiB temporary is 16 faults, not 8192)."""
    def faults(mode):
        res = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, check=True,
                             cwd=Path(__file__).parents[1])
        return [int(n) for n in res.stdout.split()]

    default, keep = sorted(faults("default")[5:]), sorted(faults("keep")[5:])  # the last five steps
    # measured per step: default 16-37k every step; keep mostly 0, now and then 2-12k as the heap
    # grows into fragments (a sum over steps was too noisy a measure)
    assert default[0] > 4096  # every default step maps fresh memory for its temporaries
    assert keep[2] * 4 < default[2]  # the median step under keep_freed_memory: (almost) no faults
