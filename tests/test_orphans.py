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

from tests.conftest import needs_bwrap

ROOT = Path(__file__).resolve().parents[1]

TRAINER = """
import time
from grpo.rewards.reward import RewardOptions
from grpo.rewards.runner import RewardRunner

runner = RewardRunner(["tests.rewards_for_tests:digit_share", "math"], None,
                      RewardOptions(timeout=60.0, retries=0, workers=2))
res = runner.score(["12", "\\\\boxed{\\\\frac{2}{4}}"], [{"prompt": "", "answer": "\\\\frac{1}{2}"}] * 2)
assert res.total.isfinite().all(), res
print("scored", flush=True)
time.sleep(600)
"""

# a sandboxed program still running (it sleeps), started from a thread as the code grader starts them
SANDBOXED = """
import threading
from grpo.rewards.sandbox import Sandbox

threading.Thread(target=Sandbox(slots=1).run, args=({"solution.py": "import time\\ntime.sleep(600)\\n"}, ["io"]),
                 kwargs={"timeout": 600.0}, daemon=True).start()
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


def _kill_and_check(script: str, *, ready) -> None:
    """Run ``script`` as a trainer-like process until ``ready(descendants)``, SIGKILL it, and assert
    that none of its descendants is left."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "scored", "the trainer-like process did not score its rewards"
        for _ in range(600):  # until every process the check is about has started
            children = _descendants(proc.pid)
            if ready(children):
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"the processes to check did not start: {_names(children)}")
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
    names = _names(left)
    for pid in left:  # do not leak them into the rest of the suite
        os.kill(pid, signal.SIGKILL)
    assert not left, f"still running after the trainer was killed: {names}"


def _names(pids) -> dict[int, str]:
    out = {}
    for pid in pids:
        try:
            out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
        except OSError:
            pass
    return out


def test_no_descendant_outlives_a_killed_trainer():
    # two pool workers, the resource tracker, a math-verify worker
    _kill_and_check(TRAINER, ready=lambda children: len(children) >= 4)


@needs_bwrap
def test_a_running_sandbox_dies_with_a_killed_trainer():
    def sandbox_started(children):
        names = _names(children).values()
        return any("bwrap" in n for n in names) and any("solution.py" in n and "bwrap" not in n for n in names)

    _kill_and_check(TRAINER.replace('print("scored"', SANDBOXED + '\nprint("scored"'), ready=sandbox_started)
