"""Where a served request's time goes, and what the serving fixes change, as ratios in one run.

    python bench/serve_latency.py [--run RUN_FOLDER] [--rounds 5]

The GRPO model is the run's newest checkpoint (default: the embedded default model), the fallback
its base model, both on the fast serving engine, greedy, as ``grpo serve`` runs them. Measured, each
pair interleaved round by round so that a machine shared with other jobs slows both alike (medians):

1. per request: the engine folding and packing the weights for every batch (as before DecodeParts
   were kept) against kept parts: single-request latency and tokens/s at concurrency 1;
2. contention: a GRPO request while the fallback batcher decodes long answers beside it, the
   fallback free against yielding to the GRPO model (``Batcher(yield_to=...)``), and the GRPO
   request alone for reference;
3. the pieces of one request: chat template + token count, prefill (to the first token), the
   decode step at batch 1, 2 and 4, the detokenising of an answer, the batch window.

Prints milliseconds and the ratios (after / before: below 1 is faster); the CPU line is printed too.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import torch

LONG = "Write a long, detailed story about a lighthouse keeper and a storm."


def cpu_line() -> str:
    flags = subprocess.run("grep -o 'avx512[a-z_0-9]*' /proc/cpuinfo | sort -u", shell=True, capture_output=True,
                           text=True).stdout.split()
    return "AVX-512: " + (" ".join(flags) if flags else "none (AVX2)")


def one(batcher, prompt: str, cap: int):
    t0 = time.perf_counter()
    gen = batcher.submit(prompt, cap=cap, deadline=None).result()
    return time.perf_counter() - t0, gen


def per_request(engine, batcher, prompt: str, rounds: int) -> dict:
    """Latency of one request with the decode parts rebuilt per batch against kept."""
    times = {"rebuilt": [], "kept": []}
    tokens = 0
    for _ in range(rounds):
        for mode in times:
            if mode == "rebuilt":
                engine._parts.clear()
            dt, gen = one(batcher, prompt, 32)
            times[mode].append(dt)
            tokens = gen.tokens
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"tokens": tokens, **{f"{k}_ms": round(v * 1000, 1) for k, v in med.items()},
            **{f"{k}_tok_s": round(tokens / v, 1) for k, v in med.items()}, "ratio": round(med["kept"] / med["rebuilt"], 3)}


def contention(grpo, fallback_free, fallback_yield, prompt: str, rounds: int) -> dict:
    """A GRPO request's latency while the fallback decodes long answers (free / yielding), and alone."""
    out = {"alone": [], "free": [], "yielding": []}
    for _ in range(rounds):
        out["alone"].append(one(grpo, prompt, 32)[0])
        for mode, fb in (("free", fallback_free), ("yielding", fallback_yield)):
            futs = [fb.submit(LONG, cap=160, deadline=None) for _ in range(2)]
            time.sleep(0.3)  # the fallback is decoding
            out[mode].append(one(grpo, prompt, 32)[0])
            for f in futs:
                f.result()
    med = {k: statistics.median(v) for k, v in out.items()}
    return {**{f"{k}_ms": round(v * 1000, 1) for k, v in med.items()},
            "yielding/free": round(med["yielding"] / med["free"], 3),
            "yielding/alone": round(med["yielding"] / med["alone"], 3)}


def pieces(engine, prompt_text: str, rendered: str, rounds: int, window_s: float) -> dict:
    from grpo.data.tasks import render_prompt
    from grpo.rollout.base import encode_prompts
    from grpo.rollout.fast import decode_ids

    tok = engine.tokenizer
    t0 = time.perf_counter()
    for _ in range(rounds):
        engine.prompt_tokens(render_prompt(tok, prompt_text, ""))
    render_ms = (time.perf_counter() - t0) / rounds * 1000
    ids, mask, _ = encode_prompts(tok, [rendered], max_length=10**9)
    out = {"prompt_tokens": ids.shape[1], "render_and_count_ms": round(render_ms, 2), "batch_window_ms": window_s * 1000}
    for b in (1, 2, 4):
        first, steps = [], []
        for _ in range(rounds):
            clock, t0 = [], time.perf_counter()
            decode_ids(engine.model, ids.repeat(b, 1), mask.repeat(b, 1), g=1, max_new_tokens=17, eos=[], sampler=None,
                       keys=None, with_logprobs=False, temperature=1.0, pad_id=tok.pad_token_id, clock=clock,
                       parts=engine.parts(b, ids.shape[1] + 17))
            first.append(clock[0] - t0)  # the prefill and one step
            steps += [y - x for x, y in zip(clock, clock[1:])]
        step = statistics.median(steps)
        out[f"step_ms_b{b}"] = round(step * 1000, 1)
        out[f"prefill_ms_b{b}"] = round((statistics.median(first) - step) * 1000, 1)
    answer = tok("7 + 5 = 12. The answer is 12, since seven plus five is twelve.", add_special_tokens=False)["input_ids"]
    t0 = time.perf_counter()
    for _ in range(rounds * 20):
        tok.decode(answer, skip_special_tokens=True)
    out["detokenise_ms"] = round((time.perf_counter() - t0) / (rounds * 20) * 1000, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", default="embedded:SmolLM2-135M-Instruct", help="run folder or model (default: the embedded model)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from grpo.data.tasks import render_prompt
    from grpo.serve.batcher import Batcher
    from grpo.serve.bench import held_out_prompts
    from grpo.serve.engines import make_serve_engine
    from grpo.serve.models import load_base, load_policy, source_of

    src = source_of(args.run)
    (pol, tok), (base, btok) = load_policy(src), load_base(src)
    grpo_e, fb_e = make_serve_engine("fast", pol, tok), make_serve_engine("fast", base, btok)
    grpo = Batcher(grpo_e, entropy_threshold=0.01, entropy_run=3)
    fb_free = Batcher(fb_e)
    fb_yield = Batcher(fb_e, yield_to=grpo)
    prompt_text = held_out_prompts("arithmetic")[0]
    prompt = render_prompt(tok, prompt_text, src.system_prompt)
    for b in (grpo, fb_free):
        one(b, prompt, 2)
    print(f"{args.run}; torch threads {torch.get_num_threads()}; {cpu_line()}; {time.strftime('%Y-%m-%d %H:%M')}")
    print("load average at start:", open("/proc/loadavg").read().split()[:3])
    print("1. per request (c=1):", per_request(grpo_e, grpo, prompt, args.rounds))
    print("2. GRPO request beside the fallback:", contention(grpo, fb_free, fb_yield, prompt, args.rounds))
    print("3. pieces:", pieces(grpo_e, prompt_text, prompt, args.rounds, grpo.window_s))
    print("load average at end:", open("/proc/loadavg").read().split()[:3])
    for b in (grpo, fb_free, fb_yield):
        b.stop()


if __name__ == "__main__":
    main()
