"""How far is one decode step from what this machine allows?

Compares one decode step of the model at a batch with three figures of this machine:
  - the peak compute bound, a true lower bound on the step's time: 2 * params * batch FLOPs at the
    CPU's peak fp32 rate, cores x FMA units x (vector bits / 32) x 2 x clock, with 2 FMA units a core
    (no x86 core has more) and the clock the largest the machine states (lscpu's max MHz; a VM that
    states none: its cpu MHz x 1.5, above any turbo seen here), so no step can beat it;
  - the bandwidth reference: every weight read once at the streaming rate measured here (a sum over
    512 MiB): a reference, not a bound (the machine's peak bandwidth is higher);
  - the GEMM reference: the FLOPs at the rate of a measured 2048^3 fp32 product: a reference, not a
    bound (a step of well-blocked small products can beat it);
then measures
  - the per-token decode step of HF ``generate`` (generate_rollout with keys) and of our fast backend
    (fast_rollout) at that batch, as (time(64 tokens) - time(1 token)) / 63 with EOS switched off so
    every step runs the full batch;
  - end-to-end tokens/s of both backends on real prompts (EOS on: rows that end leave the fast batch);
and prints our decode step as a multiple of each. fp32 throughout (the sampling policy's own
precision). Quiet machine wanted: check ``uptime`` first; the load average is printed, and so are
the CPU class (AVX-512 or AVX2, or the emulated class under bench/as_avx2.sh) and the kernels the
fast backend measured and chose for each batch.

    PYTHONPATH=. python bench/decode_limit.py [--model embedded:SmolLM2-135M-Instruct] [--threads 2]
    bench/as_avx2.sh .venv/bin/python bench/decode_limit.py      # an AVX-512 machine run as an AVX2 one
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

import torch

from grpo.models import load_models
from grpo.rollout.fast import fast_rollout
from grpo.rollout.hf import generate_rollout
from grpo.rollout.keys import row_keys
from grpo.rollout.tuning import kernel_plan, machine_summary

QUESTIONS = ["What is 12 + 30? Explain step by step.", "Name three prime numbers and say why they are prime.",
             "Write a haiku about the sea.", "How many legs do four spiders have?"]


def _best(fn, repeats: int) -> float:
    """Smallest wall time of ``repeats`` calls (the least disturbed by other load)."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def machine() -> dict:
    """Memory bandwidth (bytes/s) from reading 512 MiB and fp32 GEMM throughput (FLOP/s)."""
    big = torch.ones(128 * 2**20)  # 512 MiB, far past the caches
    bw = big.numel() * 4 / _best(lambda: big.sum(), 5)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    flops = 2 * 2048**3 / _best(lambda: a @ b, 5)
    return {"bandwidth": bw, "flops": flops}


FMA_UNITS = 2  # fused multiply-add pipes a core: no x86 core has more (an upper bound on throughput)


def peak_flops() -> dict:
    """This CPU's peak fp32 FLOP/s, an upper bound (module docstring), with what it assumed."""
    import re
    import subprocess

    info = open("/proc/cpuinfo").read()
    bits = 512 if re.search(r"\bavx512f\b", info) else 256
    if os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper().startswith("AVX2"):
        bits = 256  # bench/as_avx2.sh: the AVX2 class
    cores = os.cpu_count() or 1
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        lscpu = ""
    stated = re.search(r"CPU max MHz:\s*([\d.]+)", lscpu)
    if stated:
        mhz, clock = float(stated.group(1)), "lscpu's max MHz"
    else:
        stated_now = [float(m) for m in re.findall(r"cpu MHz\s*:\s*([\d.]+)", info)]
        if not stated_now:
            raise SystemExit("this machine states no clock (lscpu max MHz, /proc/cpuinfo cpu MHz): no peak bound")
        mhz, clock = 1.5 * max(stated_now), "cpu MHz x 1.5 (the machine states no maximum)"
    flops = cores * FMA_UNITS * (bits / 32) * 2 * mhz * 1e6
    return {"flops": flops, "about": f"{cores} cores x {FMA_UNITS} FMA units x {bits // 32} fp32 lanes x 2 x "
                                       f"{mhz:.0f} MHz ({clock})"}


def bound(model, batch: int, hw: dict) -> dict:
    """One decode step's peak compute bound (a true lower bound) and its references (module docstring)."""
    params = sum(p.numel() for p in model.parameters())  # tied embeddings counted once
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"weight_bytes": weight_bytes, "t_mem": weight_bytes / hw["bandwidth"],
            "t_gemm": 2 * params * batch / hw["flops"], "t_peak": 2 * params * batch / hw["peak"]["flops"]}


def step_time(backend, model, tok, prompts: list[str], g: int, repeats: int) -> float:
    """Per-token decode step at the full batch: EOS off, (t(64) - t(1)) / 63."""
    saved = model.generation_config.eos_token_id, tok.eos_token
    model.generation_config.eos_token_id, tok.eos_token = None, None  # nothing ends a row: all rows, every step
    try:
        keys = row_keys(0, 0, 0, len(prompts) * g)
        kw = dict(group_size=g, temperature=1.0, with_logprobs=False, keys=keys)
        t1 = _best(lambda: backend(model, tok, prompts, max_new_tokens=1, **kw), repeats)
        t64 = _best(lambda: backend(model, tok, prompts, max_new_tokens=64, **kw), repeats)
    finally:
        model.generation_config.eos_token_id, tok.eos_token = saved
    return (t64 - t1) / 63


def end_to_end(backend, model, tok, prompts: list[str], g: int, repeats: int) -> dict:
    """Generated tokens/s with EOS on (the real work of a rollout), best of ``repeats``."""
    keys = row_keys(1, 0, 0, len(prompts) * g)
    runs = [backend(model, tok, prompts, group_size=g, max_new_tokens=64, temperature=1.0, with_logprobs=False,
                    keys=keys) for _ in range(repeats)]
    seconds = min(r.seconds for r in runs)
    return {"seconds": seconds, "tokens": int(runs[0].lengths.sum()), "ro": runs[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="embedded:SmolLM2-135M-Instruct")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads {args.threads}, load average {os.getloadavg()}; CPU: {machine_summary()}")
    hw = {**machine(), "peak": peak_flops()}
    print(f"machine: streaming bandwidth {hw['bandwidth'] / 1e9:.1f} GB/s, 2048^3 fp32 GEMM "
          f"{hw['flops'] / 1e9:.1f} GFLOP/s, peak fp32 {hw['peak']['flops'] / 1e9:.0f} GFLOP/s ({hw['peak']['about']})")
    m = load_models(args.model, need_reference=False)
    model, tok = m.policy, m.tokenizer
    chat = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
            for q in QUESTIONS]
    ratio = {}
    for prompts, g in ((chat[:1], 8), (chat, 8)):
        n = len(prompts) * g
        b = bound(model, n, hw)
        print(f"\nbatch {n} ({len(prompts)} prompts x {g}): weights {b['weight_bytes'] / 2**20:.0f} MiB -> peak "
              f"compute bound {b['t_peak'] * 1e3:.1f} ms; references: bandwidth {b['t_mem'] * 1e3:.1f} ms, "
              f"GEMM {b['t_gemm'] * 1e3:.1f} ms")
        print("  " + kernel_plan(model, n).describe(n))
        hf_step = step_time(generate_rollout, model, tok, prompts, g, args.repeats)
        fast_step = step_time(fast_rollout, model, tok, prompts, g, args.repeats)
        print(f"  decode step, full batch: hf {hf_step * 1e3:.1f} ms, fast {fast_step * 1e3:.1f} ms "
              f"(x{hf_step / fast_step:.2f} generate's speed); fast = {fast_step / b['t_peak']:.2f} x the peak "
              f"compute bound, {fast_step / b['t_mem']:.2f} x the bandwidth reference, "
              f"{fast_step / b['t_gemm']:.2f} x the GEMM reference")
        assert fast_step >= b["t_peak"], "a step beat the peak compute bound: its assumptions are wrong here"
        ratio[n] = (fast_step / b["t_mem"], fast_step / b["t_peak"])
        if n == 8:  # the kernel choice alone: the same loop with MKL's products everywhere
            mkl = step_time(functools.partial(fast_rollout, kernels="mkl"), model, tok, prompts, g, args.repeats)
            print(f"  fast with MKL products (decode_kernels=mkl): {mkl * 1e3:.1f} ms")
        hf, fast = (end_to_end(f, model, tok, prompts, g, args.repeats) for f in (generate_rollout, fast_rollout))
        same = torch.equal(hf["ro"].completion_ids, fast["ro"].completion_ids)
        print(f"  rollout, 64 new tokens, EOS on: hf {hf['tokens'] / hf['seconds']:.1f} tok/s ({hf['seconds']:.2f} s), "
              f"fast {fast['tokens'] / fast['seconds']:.1f} tok/s ({fast['seconds']:.2f} s), "
              f"x{hf['seconds'] / fast['seconds']:.2f}; same tokens: {same}")
        print(f"  lengths {statistics.mean(hf['ro'].lengths.tolist()):.1f} mean, "
              f"{int(hf['ro'].lengths.max())} max; load average {os.getloadavg()}")
    print(f"\nour decode step at batch 8 = {ratio[8][0]:.2f} x the bandwidth reference, "
          f"{ratio[8][1]:.2f} x the peak compute bound")


if __name__ == "__main__":
    main()
