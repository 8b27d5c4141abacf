"""torch_compile=true against eager: the policy loss's forward and backward, and the advantages, timed
on the same tensors in one process (alternating, median of --reps), after a warm-up that pays the
compilation. Prints each ratio (compiled / eager: below 1 is faster) and the compile seconds.

    python bench/torch_compile_loss.py [--n 32] [--t 256] [--reps 30] [--threads 1]

Shapes: N = prompts_per_step x num_generations sequences of T completion tokens (the default run:
4 x 8 = 32 sequences of 32 tokens; a reasoning run: 256 or more).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from grpo.train.compiled import loss_and_advantage_functions


def _inputs(n: int, t: int):
    gen = torch.Generator().manual_seed(0)
    theta = torch.randn(n, t, generator=gen).requires_grad_(True)
    old = -torch.nn.functional.softplus(theta.detach() + 0.1 * torch.randn(n, t, generator=gen))
    ref = -torch.nn.functional.softplus(theta.detach() + 0.1 * torch.randn(n, t, generator=gen))
    adv = torch.randn(n, 1, generator=gen).expand(n, t).contiguous()
    mask = (torch.arange(t)[None, :] < torch.randint(t // 2, t + 1, (n, 1), generator=gen)).float()
    return theta, old, ref, adv, mask


def _loss_seconds(fn, n: int, t: int) -> float:
    theta, old, ref, adv, mask = _inputs(n, t)
    start = time.perf_counter()
    logp = -torch.nn.functional.softplus(theta)
    fn(logp, old, adv, mask, ref_logp=ref, kl_coef=0.04)["loss"].backward()
    return time.perf_counter() - start


def _adv_seconds(fn, b: int, g: int) -> float:
    r = torch.rand(b, g)
    start = time.perf_counter()
    fn(r, estimator="grpo")
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--t", type=int, default=256)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    (loss_e, adv_e), (loss_c, adv_c) = loss_and_advantage_functions(False), loss_and_advantage_functions(True)
    b, g = args.n // args.group, args.group
    start = time.perf_counter()
    _loss_seconds(loss_c, args.n, args.t)
    _adv_seconds(adv_c, b, g)
    compile_s = time.perf_counter() - start
    for _ in range(3):  # warm both
        _loss_seconds(loss_e, args.n, args.t), _loss_seconds(loss_c, args.n, args.t)
    le, lc, ae, ac = [], [], [], []
    for _ in range(args.reps):  # alternating, so contention falls on both alike
        le.append(_loss_seconds(loss_e, args.n, args.t))
        lc.append(_loss_seconds(loss_c, args.n, args.t))
        ae.append(_adv_seconds(adv_e, b, g))
        ac.append(_adv_seconds(adv_c, b, g))
    med = statistics.median
    print(json.dumps({"n": args.n, "t": args.t, "threads": args.threads, "compile_seconds": round(compile_s, 2),
                      "loss_fwd_bwd_ms": {"eager": round(1e3 * med(le), 3), "compiled": round(1e3 * med(lc), 3),
                                          "ratio": round(med(lc) / med(le), 3)},
                      "advantages_ms": {"eager": round(1e3 * med(ae), 4), "compiled": round(1e3 * med(ac), 4),
                                        "ratio": round(med(ac) / med(ae), 3)}}, indent=2))


if __name__ == "__main__":
    main()
