"""A LoRA policy on vLLM: merged weights vs a vLLM LoRA adapter, seconds per weight sync + rollout.

merged (what rollout_engine=vllm does): after each step the adapters are merged into a copy of the
base weights (W + scaling B A), the full weights written to /dev/shm and reloaded in place.
adapter: the engine is started with ``enable_lora`` and, after each step, the adapter alone is saved
(peft's save_pretrained) and sampled with a new ``LoRARequest`` (vLLM loads it; the base weights
never move; every forward adds the low-rank products).

SmolLM2-135M-Instruct fp32, LoRA r=16 alpha=32 on all linear layers (the config's defaults), the B
matrices drawn nonzero; ``--rows`` rows of ``--tokens`` new tokens (EOS ignored so both draw the same
number), ``--rounds`` rounds each, the first a warm-up. Prints each mode's sync and rollout seconds
(median) and adapter / merged ratios, with the CPU's AVX-512 flags, the load average and the date.

    PYTHONPATH=. .venv-vllm/bin/python bench/vllm_lora.py [--rows 32] [--tokens 64] [--rounds 4]
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import tempfile
import time

import torch

from bench.engines import commit, cpu_line

QUESTION = "What is {} + {}? Explain step by step."


def _policy():
    from grpo.models import DEFAULT_MODEL, load_models

    m = load_models(DEFAULT_MODEL, need_reference=False, lora_r=16, lora_alpha=32, lora_target_modules="all-linear")
    with torch.no_grad():
        for name, p in m.policy.named_parameters():
            if "lora_B" in name:
                p.normal_(std=1e-3, generator=torch.Generator().manual_seed(0))  # B = 0 at init: no delta
    return m


def _nudge(policy, i: int) -> None:
    """Stand-in for an optimizer step: the adapters change, so each round has new weights to send."""
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.add_(1e-4 * (i + 1))


def _params(rows: int, tokens: int) -> list[dict]:
    """Each row's SamplingParams keyword arguments: seeded, EOS ignored, the sampled tokens' log-probs."""
    return [{"n": 1, "max_tokens": tokens, "ignore_eos": True, "temperature": 1.0, "seed": r, "logprobs": 0,
             "detokenize": False} for r in range(rows)]


def merged(m, prompts, rows, tokens, rounds) -> tuple[list[float], list[float]]:
    from grpo.rollout import make_engine
    from grpo.rollout.vllm.rows import VLLMOptions, llm_sample

    engine = make_engine("vllm", m.policy, m.tokenizer, options=VLLMOptions(gpu_memory_utilization=0.2))
    sync, roll = [], []
    try:
        for i in range(rounds):
            _nudge(m.policy, i)
            t0 = time.perf_counter()
            engine.sync_weights(m.policy)
            t1 = time.perf_counter()
            llm_sample(engine.llm, prompts, _params(rows, tokens))
            sync.append(t1 - t0)
            roll.append(time.perf_counter() - t1)
    finally:
        engine.close()
    return sync, roll


def adapter(m, prompts, rows, tokens, rounds) -> tuple[list[float], list[float]]:
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    llm = LLM(model=m.path, dtype="float32", skip_tokenizer_init=True, seed=0, gpu_memory_utilization=0.2,
              enforce_eager=True, enable_lora=True, max_lora_rank=16, max_loras=1,
              logprobs_mode="processed_logprobs", enable_prefix_caching=True)
    sync, roll = [], []
    try:
        with tempfile.TemporaryDirectory(prefix="grpo-lora-", dir="/dev/shm") as tmp:
            for i in range(rounds):
                _nudge(m.policy, i)
                t0 = time.perf_counter()
                folder = os.path.join(tmp, f"step-{i}")
                m.policy.save_pretrained(folder)
                request = LoRARequest(f"step-{i}", i + 1, folder)
                if i:
                    llm.llm_engine.remove_lora(i)  # the last step's adapter
                t1 = time.perf_counter()
                llm.generate([{"prompt_token_ids": p} for p in prompts], [SamplingParams(**d) for d in _params(rows, tokens)],
                             use_tqdm=False, lora_request=request)
                sync.append(t1 - t0)
                roll.append(time.perf_counter() - t1)
    finally:
        llm.llm_engine.engine_core.shutdown()
    return sync, roll


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=4)
    a = p.parse_args()
    m = _policy()
    texts = [m.tokenizer.apply_chat_template([{"role": "user", "content": QUESTION.format(r, 2 * r)}],
                                             tokenize=False, add_generation_prompt=True) for r in range(a.rows)]
    prompts = [m.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    print(f"# bench/vllm_lora.py  {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {commit()}")
    print(f"# CPU: {cpu_line()}; load average {os.getloadavg()[0]:.1f}; {a.rows} rows x {a.tokens} tokens")
    res = {"merged": merged(m, prompts, a.rows, a.tokens, a.rounds),
           "adapter": adapter(m, prompts, a.rows, a.tokens, a.rounds)}
    med = {k: (statistics.median(s[1:]), statistics.median(r[1:])) for k, (s, r) in res.items()}
    print("\n| mode | sync s | rollout s | sync + rollout s |\n|---|---|---|---|")
    for k, (s, r) in med.items():
        print(f"| {k} | {s:.2f} | {r:.2f} | {s + r:.2f} |")
    (ms, mr), (as_, ar) = med["merged"], med["adapter"]
    print(f"\nadapter / merged: sync {as_ / ms:.2f}x, rollout {ar / mr:.2f}x, sync + rollout {(as_ + ar) / (ms + mr):.2f}x")


if __name__ == "__main__":
    main()
