"""launcher=ray against the local run, and one weight sync by each path, on the embedded model.

1. Step time: ``grpo train`` on the embedded default (SmolLM2-135M-Instruct, arithmetic, 4 x 8) for
   ``--steps`` steps, in this process's machine alone (local) and with ``launcher=ray`` on a Ray instance
   started here: 1 trainer rank and 1 rollout worker, each reserving ``--cpus`` logical CPUs (Ray's CPUs
   are slots: sampling and updating take turns in a synchronous run, so each may use every core). The
   mean step_seconds of steps 2..N (step 1 starts the engines) of each, and their ratio.
2. One weight sync of the model's every weight (a full fine-tune's, as ``cluster/weight_sync_bytes``
   counts it) from this process to a Ray actor holding a replica, end to end (sent, received, copied
   into the replica): by Ray's object store (``ray.put`` of numpy arrays, the actor's ``ray.get`` maps
   them), and by a torch.distributed broadcast over a gloo group of the two processes alone (one flat
   buffer per dtype, as TRL and verl broadcast to vLLM; NCCL on GPUs). The median of ``--repeats`` and
   the figure each implies for a 7B model in bf16 (14 GB) at the same throughput.

    PYTHONPATH=. python bench/cluster.py [--steps 6] [--cpus 2] [--repeats 5] [--out results.json]

Prints the CPU, the load average before each part and the commit.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import commit, cpu_line  # bench/machine.py

ROOT = Path(__file__).resolve().parents[1]
SEVEN_B_BYTES = 7e9 * 2  # a 7B model's weights in bf16


def _steps(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def step_times(steps: int, cpus: float, extra: list[str]) -> dict:
    """Mean step_seconds of steps 2..N, local and on Ray (1 trainer, 1 rollout worker)."""
    out = {}
    for name, args in (("local", []), ("ray", ["launcher=ray", "ray_trainers=1", "ray_rollout_workers=1",
                                              f"ray_trainer_cpus={cpus}", f"ray_rollout_cpus={cpus}"])):
        with tempfile.TemporaryDirectory() as tmp:
            print(f"  {name}: load average {os.getloadavg()[0]:.2f}", flush=True)
            cmd = [sys.executable, "-m", "grpo", "train", f"max_steps={steps}", "eval_prompts=0", "progress=false",
                   "report_to=none", f"output_dir={tmp}/run", *args, *extra]
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
            if proc.returncode:
                sys.exit(f"{name} run failed:\n{proc.stderr[-3000:]}")
            m = _steps(Path(tmp) / "run")[1:]
            out[name] = {"step_seconds": sum(x["step_seconds"] for x in m) / len(m),
                         "generation_seconds": sum(x["generation_seconds"] for x in m) / len(m),
                         "sync_seconds": sum(x.get("cluster/weight_sync_seconds", 0.0) for x in m) / len(m),
                         "sync_bytes": m[-1].get("cluster/weight_sync_bytes", 0)}
    out["ratio"] = out["ray"]["step_seconds"] / out["local"]["step_seconds"]
    return out


class Receiver:
    """The actor's side: a replica's weights, filled by either path."""

    def __init__(self, shapes: dict):
        import torch

        self.weights = {n: torch.empty(s, dtype=getattr(torch, d)) for n, (d, s) in shapes.items()}
        self.pg = None

    def by_store(self, wire: dict) -> int:
        import torch

        from grpo.cluster.wire import from_wire

        with torch.no_grad():
            for name, t in from_wire(wire).items():
                self.weights[name].copy_(t)
        return len(wire)

    def join(self, host: str, port: int) -> None:
        import torch.distributed as dist

        store = dist.TCPStore(host, port, 2, False, timeout=datetime.timedelta(seconds=60))
        self.pg = dist.ProcessGroupGloo(store, 1, 2, datetime.timedelta(seconds=300))

    def by_broadcast(self, layout: list) -> int:
        import torch
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        for dtype, numel, names in layout:
            flat = torch.empty(numel, dtype=getattr(torch, dtype))
            self.pg.broadcast([flat], opts).wait()
            off = 0
            with torch.no_grad():
                for name in names:
                    w = self.weights[name]
                    w.copy_(flat[off:off + w.numel()].view_as(w))
                    off += w.numel()
        return len(layout)


def embedded_weights() -> dict:
    """The embedded model's parameters as the trainer holds them (float32, the default dtype; tied ones once)."""
    from transformers import AutoModelForCausalLM

    from grpo.config.fields import DEFAULT_MODEL
    from grpo.models.loading import resolve_model_path

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(DEFAULT_MODEL), dtype="float32")
    return {n: p.detach() for n, p in model.named_parameters()}


def weight_sync(repeats: int) -> dict:
    """Seconds of one sync of every weight of the embedded model, by object store and by gloo broadcast."""
    import ray
    import torch
    import torch.distributed as dist

    from grpo.cluster.wire import to_wire, wire_bytes

    weights = embedded_weights()
    nbytes = sum(t.numel() * t.element_size() for t in weights.values())
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        shapes = {n: (str(t.dtype).removeprefix("torch."), tuple(t.shape)) for n, t in weights.items()}
        actor = ray.remote(Receiver).options(num_cpus=1).remote(shapes)
        store_s = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            wire = to_wire(weights)
            ray.get(actor.by_store.remote(ray.put(wire)))
            store_s.append(time.perf_counter() - t0)
            assert wire_bytes(wire) == nbytes
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        tcp = dist.TCPStore("127.0.0.1", port, 2, True, timeout=datetime.timedelta(seconds=60), wait_for_workers=False)
        joined = actor.join.remote("127.0.0.1", port)
        pg = dist.ProcessGroupGloo(tcp, 0, 2, datetime.timedelta(seconds=300))
        ray.get(joined)
        by_dtype: dict = {}
        for n, t in weights.items():
            by_dtype.setdefault(t.dtype, []).append(n)
        layout = [(str(d).removeprefix("torch."), sum(weights[n].numel() for n in ns), ns) for d, ns in by_dtype.items()]
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        bcast_s = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            done = actor.by_broadcast.remote(layout)
            for d, ns in by_dtype.items():
                flat = torch.cat([weights[n].reshape(-1) for n in ns])
                pg.broadcast([flat], opts).wait()
            ray.get(done)
            bcast_s.append(time.perf_counter() - t0)
    finally:
        ray.shutdown()

    def med(xs):
        return sorted(xs)[len(xs) // 2]
    out = {"bytes": nbytes, "object_store_seconds": med(store_s), "gloo_broadcast_seconds": med(bcast_s)}
    for k in ("object_store", "gloo_broadcast"):
        out[f"{k}_gb_per_s"] = nbytes / out[f"{k}_seconds"] / 1e9
        out[f"{k}_seconds_7b_bf16"] = SEVEN_B_BYTES / nbytes * out[f"{k}_seconds"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--cpus", type=float, default=2.0, help="logical CPUs the trainer and the worker each reserve")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--set", nargs="*", default=[], help="extra key=value for both runs")
    ap.add_argument("--skip-steps", action="store_true", help="only the weight sync")
    ap.add_argument("--out")
    args = ap.parse_args()
    print(f"CPU: {cpu_line()}\ncommit {commit()}, {datetime.date.today()}", flush=True)
    result: dict = {"cpu": cpu_line(), "commit": commit(), "date": str(datetime.date.today())}
    if not args.skip_steps:
        print(f"step time, {args.steps} steps of the embedded default (steps 2..{args.steps} averaged):", flush=True)
        st = result["steps"] = step_times(args.steps, args.cpus, args.set)
        for name in ("local", "ray"):
            r = st[name]
            print(f"  {name:5s}: {r['step_seconds']:.2f} s/step (sampling {r['generation_seconds']:.2f} s"
                  + (f", weight sync {r['sync_seconds']:.2f} s of {r['sync_bytes'] / 1e6:.0f} MB)" if name == "ray" else ")"))
        print(f"  ray / local: {st['ratio']:.3f}x", flush=True)
    print(f"one weight sync of every weight (median of {args.repeats}), load average {os.getloadavg()[0]:.2f}:", flush=True)
    ws = result["weight_sync"] = weight_sync(args.repeats)
    print(f"  {ws['bytes'] / 1e6:.0f} MB")
    for k, label in (("object_store", "Ray object store"), ("gloo_broadcast", "gloo broadcast")):
        print(f"  {label:17s}: {ws[k + '_seconds']:.3f} s ({ws[k + '_gb_per_s']:.2f} GB/s); a 7B model in bf16 "
              f"(14 GB) at that rate: {ws[k + '_seconds_7b_bf16']:.1f} s")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
