"""Every process grpo starts dies with the trainer: a trainer-like process that has scored rewards
in worker processes (the reward runner's pool, its multiprocessing resource tracker, math-verify's
workers) is killed with SIGKILL, as a crash or the OOM killer would, and none of its descendants is
left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TRAINER = """
import time
from grpo.rewards.runner import RewardRunner

runner = RewardRunner(["tests.rewards_for_tests:digit_share", "math"], None, timeout=60.0, workers=2)
res = runner.score(["12", "\\\\boxed{\\\\frac{2}{4}}"], [{"prompt": "", "answer": "\\\\frac{1}{2}"}] * 2)
assert res.total.isfinite().all(), res
print("scored", flush=True)
time.sleep(600)
"""

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, start time, state) of a process from /proc, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "
    return int(fields[1]), int(fields[19]), fields[0]


def _descendants(root: int) -> dict[int, int]:
    """{pid: start time} of every living descendant of ``root``."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            table[int(entry)] = st
    found, frontier = {}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, start, _) in table.items():
            if ppid == parent and pid not in found:
                found[pid] = start
                frontier.append(pid)
    return found


def _alive(pid: int, start: int) -> bool:
    st = _stat(pid)
    return st is not None and st[1] == start and st[2] not in ("Z", "X")  # the same process, not yet dead


def test_no_descendant_outlives_a_killed_trainer():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", TRAINER], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "scored", "the trainer-like process did not score its rewards"
        children = _descendants(proc.pid)
        # two pool workers, the resource tracker, at least one math-verify worker
        assert len(children) >= 4, children
    finally:
        proc.kill()  # SIGKILL: nothing of the trainer's own clean-up runs
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    left = children
    for _ in range(300):  # the kernel's signal and the tracker's EOF take milliseconds; allow for a busy host
        left = {pid: start for pid, start in left.items() if _alive(pid, start)}
        if not left:
            break
        time.sleep(0.1)
    for pid in left:  # do not leak them into the rest of the suite
        os.kill(pid, signal.SIGKILL)
    assert not left, f"still running after the trainer was killed: {sorted(left)}"
