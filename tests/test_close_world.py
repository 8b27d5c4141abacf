"""Leaving the process group (grpo.infra.distributed.close_world) on two real gloo processes: after a
finished run no rank leaves before every rank has arrived (a rank that tore its connections down while
another was still in a collective crashed that one); after an error a rank leaves at once (the others
may never arrive)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from grpo.serve.bench import free_port

ROOT = Path(__file__).resolve().parents[1]
LATE = 2.0  # seconds rank 1 waits before it leaves

RANK = """
import json, sys, time
from grpo.infra.distributed import close_world, init_world
import torch.distributed as dist
finished, late, flag = sys.argv[1] == "finished", float(sys.argv[2]), sys.argv[3]
world = init_world()
dist.barrier()  # both joined: the clocks below start together
joined = time.time()
if world.rank == 1:
    time.sleep(late)
    if not finished:  # the failing rank never reaches close_world; it waits (a minute at most) to see rank 0 leave
        import os
        end = time.time() + 60
        while not os.path.exists(flag) and time.time() < end:
            time.sleep(0.02)
        print(json.dumps({"rank": 1, "saw_rank0_leave": os.path.exists(flag)}), flush=True)
        sys.exit(0)
arrived = time.time()
close_world(world, finished=finished)
if world.rank == 0:
    open(flag, "w").close()
print(json.dumps({"rank": world.rank, "joined": joined, "arrived": arrived, "left": time.time(),
                  "initialized": dist.is_initialized()}), flush=True)
"""


def _two_ranks(finished: bool) -> dict[int, dict]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    flag = tempfile.mktemp(prefix="grpo-close-world-")
    procs = [subprocess.Popen([sys.executable, "-c", RANK, "finished" if finished else "error", str(LATE), flag],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    out = {}
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr[-3000:]
        for line in stdout.splitlines():
            row = json.loads(line)
            out[row["rank"]] = row
    return out


def test_after_a_finished_run_no_rank_leaves_before_the_last_arrives():
    ranks = _two_ranks(finished=True)
    assert not ranks[0]["initialized"] and not ranks[1]["initialized"]
    assert ranks[0]["left"] >= ranks[1]["arrived"]  # rank 0 waited for the late rank (events, one clock)


def test_after_an_error_a_rank_leaves_without_waiting():
    ranks = _two_ranks(finished=False)
    assert set(ranks) == {0, 1} and "arrived" not in ranks[1] and not ranks[0]["initialized"]
    assert ranks[1]["saw_rank0_leave"]  # rank 1 never arrives: rank 0 left while it was still there
