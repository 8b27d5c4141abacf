"""The trainer with the trusted rewards: sandboxed code under fire, process supervision."""

from __future__ import annotations

import json
import os

from grpo.rewards import code as code_rewards
from grpo.rewards.code import CodeGrader
from grpo.rewards.sandbox import UID_BASE, UID_COUNT
from grpo.train.trainer import Trainer
from tests.conftest import needs_bwrap
from tests.test_trainer import make_cfg

HOSTILE = [
    "def f(x):\n    while True:\n        pass\n",
    "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    "import os\nos._exit(0)\n",
    "class A:\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return A()\n",
    "a = []\nwhile True:\n    a.append(bytearray(10**7))\n",
    "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(-1, signal.SIGKILL)\n",
    # returns 0.5, which no test of the integer tasks expects (-1 passed 'assert f(3) == -1' of one
    # problem when a seed paired them)
    "import subprocess\nsubprocess.Popen(['sleep', '1000'])\ndef f(x):\n    return 0.5\n",
    "while True:\n    print('x' * 10000)\n",
]


def under_fire(t: Trainer) -> Trainer:
    """Every 10th completion the trainer samples becomes a hostile program, every 3rd the task's
    reference solution and the others a refusal that is not Python (scores 0 without a sandbox), so
    the expected reward does not depend on what the random model writes under a given seed."""
    original, seen = t.collector.sample, [0]

    def sample(**kw):
        samples, ro = original(**kw)
        g = t.cfg.num_generations
        for i in range(len(ro.texts)):
            k = seen[0] + i
            if k % 10 == 0:
                ro.texts[i] = f"```python\n{HOSTILE[(k // 10) % len(HOSTILE)]}```"
            elif k % 3 == 0:
                ro.texts[i] = f"```python\n{samples[i // g]['answer']}```"
            else:
                ro.texts[i] = "I cannot write this program."
        seen[0] += len(ro.texts)
        return samples, ro

    t.collector.sample = sample
    return t


def _descendants_and_sandbox_processes() -> set[int]:
    """Live processes below this one, or of a sandbox uid."""
    me, found, parent = os.getpid(), set(), {}
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            if fields["State"].strip().startswith("Z"):
                continue
            pid, uid = int(entry), int(fields["Uid"].split()[0])
            parent[pid] = int(fields["PPid"])
            if UID_BASE <= uid < UID_BASE + UID_COUNT:
                found.add(pid)
        except (OSError, ValueError, KeyError):
            continue
    for pid in parent:
        p = pid
        while p in parent and p not in (0, 1):
            if parent[p] == me:
                found.add(pid)
                break
            p = parent[p]
    return found


@needs_bwrap
def test_thirty_steps_on_the_code_task_with_hostile_completions(tmp_path, tiny_model_dir, monkeypatch):
    grader = CodeGrader(test_timeout=1.0, program_timeout=5.0, slots=4)
    grader.check()
    monkeypatch.setattr(code_rewards, "_default", grader)  # short deadlines for the test; still bwrap
    before = _descendants_and_sandbox_processes()
    cfg = make_cfg(tmp_path, tiny_model_dir, "code", task="code", rewards="code", max_steps=30,
                   eval_prompts=0, max_completion_length=8)
    t = under_fire(Trainer(cfg))
    result = t.train()
    lines = [json.loads(l) for l in (t.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines] == list(range(1, 31))
    # 240 completions: 24 hostile (k % 10 == 0) score 0; references (k % 3 == 0 and not k % 10 == 0:
    # 80 - 8 = 72) score 1; the refusals score 0. Every step has 8, so the mean is 72 / 240.
    mean = sum(l["rewards/code"] for l in lines) / 30
    assert abs(mean - 72 / 240) < 1e-9
    assert all(l["reward_failures"] == 0 for l in lines)
    assert "checkpoint" in result
    assert _descendants_and_sandbox_processes() - before == set()
