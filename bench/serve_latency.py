"""Where a served request's time goes, on the fast serving engine, in one run.

    python bench/serve_latency.py [--run RUN_FOLDER] [--rounds 5]

The GRPO model is the run's newest checkpoint (default: the embedded default model), the fallback
its base model, greedy, as ``grpo serve`` runs them (one scheduler thread). Medians of ``--rounds``:

1. the engine step: decoding n rows at once (n = 1, 4, 8, 16), and a step that also prefills a chat
   prompt beside 4 decoding rows (continuous batching: what an arriving request costs the others);
2. the prefill of one chat prompt with its prefix (the system prompt) cached against not;
3. one request of the run's first held-out prompt through the scheduler: alone, and while the
   fallback decodes two long answers (the scheduler's slack rule at the seed's 0.8 s deadline).

Each ``--dtype`` (the engines' weights: float32, bfloat16, auto) in turn, and their ratios at the end.
Prints milliseconds and ratios, with the CPU line and the load average (a shared machine shows there).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.machine import commit, cpu_line  # noqa: E402

LONG = "Write a long, detailed story about a lighthouse keeper and a storm."


def step_times(engine, prompt: str, rounds: int) -> dict:
    from grpo.serve.engines import Job

    out = {}
    for n in (1, 4, 8, 16):
        times = []
        for _ in range(rounds):
            for _ in range(n):
                engine.admit(Job(prompt, cap=6))
            engine.step()  # the prefill
            while engine.rows:
                t = time.perf_counter()
                engine.step()
                times.append(time.perf_counter() - t)
        out[f"decode_b{n}_ms"] = round(statistics.median(times) * 1000, 1)
    times = []
    for _ in range(rounds):
        for _ in range(4):
            engine.admit(Job(prompt, cap=6))
        engine.step()
        engine.admit(Job(prompt.replace("?", " ?"), cap=2))  # a new prompt, its own tail to prefill
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
        while engine.rows:
            engine.step()
    out["decode_b4_plus_prefill_ms"] = round(statistics.median(times) * 1000, 1)
    return out


def prefill(engine, prompts: list[str], rounds: int) -> dict:
    from grpo.serve.engines import Job

    times = {"cached": [], "uncached": []}
    for r in range(rounds):
        for mode in times:
            if mode == "uncached":
                engine.prefix.clear()
            engine.admit(Job(prompts[r % len(prompts)], cap=1))
            t = time.perf_counter()
            engine.step()
            times[mode].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {**{f"{k}_ms": round(v * 1000, 1) for k, v in med.items()}, "cached/uncached": round(med["cached"] / med["uncached"], 3)}


def requests(grpo, fallback, prompt: str, rounds: int) -> dict:
    out = {"alone": [], "beside_fallback": []}
    tokens = 0
    for _ in range(rounds):
        t = time.perf_counter()
        gen = grpo.submit(prompt, cap=512, deadline=time.monotonic() + 0.8).result()
        out["alone"].append(time.perf_counter() - t)
        tokens = gen.tokens
        futs = [fallback.submit(LONG, cap=160, deadline=None) for _ in range(2)]
        time.sleep(0.2)  # the fallback is decoding
        t = time.perf_counter()
        grpo.submit(prompt, cap=512, deadline=time.monotonic() + 0.8).result()
        out["beside_fallback"].append(time.perf_counter() - t)
        for f in futs:
            f.result()
    med = {k: statistics.median(v) for k, v in out.items()}
    return {"tokens": tokens, **{f"{k}_ms": round(v * 1000, 1) for k, v in med.items()},
            "alone_ms_per_token": round(med["alone"] * 1000 / max(tokens, 1), 1),
            "beside/alone": round(med["beside_fallback"] / med["alone"], 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", default="embedded:SmolLM2-135M-Instruct", help="run folder or model (default: the embedded model)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dtype", default="float32,bfloat16", help="the engines' --dtype values to compare, in turn")
    args = ap.parse_args()
    import torch

    from grpo.data.tasks import render_prompt
    from grpo.rollout.tuning import take_messages
    from grpo.serve.batcher import Lane, Scheduler
    from grpo.serve.bench import held_out_prompts
    from grpo.serve.engines import make_serve_engine
    from grpo.serve.models import fallback_source, load_base, load_policy, source_of
    from grpo.serve.scheme import DEFAULT_ENTROPY_THRESHOLD

    src = source_of(args.run)
    (pol, tok), (base, btok) = load_policy(src), load_base(fallback_source(src, "base"))
    texts = held_out_prompts("arithmetic")
    prompts = [render_prompt(tok, t, src.system_prompt) for t in texts[:8]]
    print(f"{args.run}; commit {commit()}; torch threads {torch.get_num_threads()}; {cpu_line()}; "
          f"{time.strftime('%Y-%m-%d %H:%M')}; load average at start {open('/proc/loadavg').read().split()[:3]}")
    firsts = {}
    for dtype in args.dtype.split(","):
        options = {"dtype": dtype}
        grpo_e = make_serve_engine("fast", pol, tok, max_rows=16, max_len=1024 + 512, options=options)
        fb_e = make_serve_engine("fast", base, btok, max_rows=16, max_len=1024 + 1024, options=options)
        print(f"--dtype {dtype}:", *take_messages(), sep="\n  ")
        steps = step_times(grpo_e, prompts[0], args.rounds)
        print("1. engine step:", steps)
        print("2. prefill of one chat prompt:", prefill(grpo_e, prompts, args.rounds))
        grpo, fallback = Lane(grpo_e, entropy_threshold=DEFAULT_ENTROPY_THRESHOLD, entropy_run=3), Lane(fb_e, name="base")
        sched = Scheduler([grpo, fallback])
        try:
            req = requests(grpo, fallback, prompts[0], args.rounds)
            print("3. one request (c=1):", req)
        finally:
            sched.stop()
        firsts[dtype] = (steps["decode_b1_ms"], req["alone_ms_per_token"])
    if len(firsts) > 1:
        (ref, (step0, req0)), *others = firsts.items()
        for dtype, (step, req) in others:
            print(f"{dtype} / {ref}: decode step at 1 row {step / step0:.2f}x, one request alone per token {req / req0:.2f}x "
                  "(the answers' lengths may differ: rounded weights can change the greedy tokens)")
    print("load average at end:", open("/proc/loadavg").read().split()[:3])


if __name__ == "__main__":
    main()
