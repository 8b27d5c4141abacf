"""The trainer with the trusted rewards: sandboxed code under fire, process supervision."""

from __future__ import annotations

import json
import os

import pytest

from grpo.rewards import code, code_rewards
from grpo.rewards.code import CodeGrader
from grpo.rewards.sandbox import UID_BASE, UID_COUNT
from grpo.train.trainer import Trainer
from tests.conftest import TEST_BF16, TEST_SEED, needs_bwrap
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
    """Live processes below this one, and sandbox processes whose tree hangs from init (only sandbox
    uids and bwrap between them and init: left behind by a sandbox); another process's live sandboxes,
    as a second suite's on the same machine, are not counted."""
    me, parent, uid, name = os.getpid(), {}, {}, {}
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            if fields["State"].strip().startswith("Z"):
                continue
            pid = int(entry)
            parent[pid], uid[pid], name[pid] = int(fields["PPid"]), int(fields["Uid"].split()[0]), fields["Name"].strip()
        except (OSError, ValueError, KeyError):
            continue

    def sandboxed(pid: int) -> bool:
        return UID_BASE <= uid.get(pid, -1) < UID_BASE + UID_COUNT

    def orphaned(pid: int) -> bool:
        p = pid
        while parent.get(p) not in (None, 0, 1):
            p = parent[p]
            if not (sandboxed(p) or name.get(p) == "bwrap"):
                return False
        return True

    found = {pid for pid in parent if sandboxed(pid) and orphaned(pid)}
    for pid in parent:
        p = pid
        while p in parent and p not in (0, 1):
            if parent[p] == me:
                found.add(pid)
                break
            p = parent[p]
    return found


@needs_bwrap
def test_fifteen_steps_on_the_code_task_with_hostile_completions(tmp_path, tiny_model_dir, monkeypatch):
    grader = CodeGrader(test_timeout=1.0, program_timeout=5.0, slots=4)
    grader.check()
    monkeypatch.setitem(code.GRADERS, "default", grader)  # short deadlines for the test; still bwrap
    before = _descendants_and_sandbox_processes()
    cfg = make_cfg(tmp_path, tiny_model_dir, "code", task="code", rewards="code", max_steps=15,
                   eval_prompts=0, max_completion_length=8)
    t = under_fire(Trainer(cfg))
    result = t.train()
    lines = [json.loads(l) for l in (t.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines] == list(range(1, 16))
    # 120 completions: 12 hostile (k % 10 == 0: each of HOSTILE at least once) score 0; references
    # (k % 3 == 0 and not k % 10 == 0: 40 - 4 = 36) score 1; the refusals score 0. Every step has 8, so
    # the mean is 36 / 120.
    mean = sum(l["rewards/code"] for l in lines) / 15
    assert abs(mean - 36 / 120) < 1e-9
    assert all(l["reward_failures"] == 0 for l in lines)
    assert "checkpoint" in result
    assert _descendants_and_sandbox_processes() - before == set()


# ---- rewards that cannot score: the run stops with one line, what it wrote is kept ----------------

def _cli_train(run, tiny_model_dir, tiny_dataset, *extra) -> list[str]:
    return ["train", f"model={tiny_model_dir}", f"task={tiny_dataset}", f"output_dir={run}", "max_steps=3",
            "num_generations=4", "prompts_per_step=2", "per_device_train_batch_size=4", "max_completion_length=6",
            "eval_max_new_tokens=4", "eval_pass_k=0", "progress=false", "report_to=none", "reward_timeout=0",
            f"bf16={TEST_BF16}", f"seed={TEST_SEED}", *extra]


@pytest.mark.parametrize("eval_prompts", [0, 2], ids=["training", "evaluation"])
def test_a_reward_that_fails_everywhere_stops_the_run_with_one_line(capsys, tmp_path, tiny_model_dir, tiny_dataset,
                                                                    eval_prompts):
    """A reward that raises on every completion scores none: the run stops at its first evaluation or
    step, exit 2, one line naming the reward and its exception, instead of training on nothing to
    "accuracy 0.0% -> 0.0%"."""
    from grpo.cli import main

    name, run = "tests.rewards_for_tests:always_raises", tmp_path / "run"
    code = main(_cli_train(run, tiny_model_dir, tiny_dataset, f"rewards={name}", f"eval_prompts={eval_prompts}"))
    out = capsys.readouterr().err
    errors = [line for line in out.splitlines() if "error" in line.lower()]  # past the weights' progress bar
    assert code == 2 and len(errors) == 1 and "Traceback" not in out, out
    err = errors[0]
    assert err.startswith("grpo train: error: ") and f"reward {name!r}" in err
    assert "RuntimeError: this reward is broken on purpose" in err
    if eval_prompts:
        assert "evaluation: the verifier" in err and "could not score 2 of the 2 greedy completions" in err
    else:
        assert "8 of the step's 8 completions could not be scored (max_reward_failure_share=1)" in err
    assert err.strip().endswith("stopped before the first step finished (no checkpoint written)")
    assert not (run / "checkpoints").exists() and not (run / "metrics.jsonl").exists()
    assert (run / "config.yaml").is_file()  # what the run wrote is kept


@pytest.mark.parametrize("save_steps", [0, 1], ids=["unsaved", "saved"])
def test_rewards_failing_mid_run_stop_it_with_the_last_step_kept(tmp_path, tiny_model_dir, tiny_dataset, save_steps):
    """Rewards that score the first two steps and then fail everywhere (a grading service gone) stop
    the run at step 3 with RewardError; the checkpoint of step 2 is there (written now, or kept as
    the periodic save wrote it) and holds the sampler where step 2 left it, so a resume with the
    reward fixed draws step 3's prompts; the metrics of steps 1 and 2 are kept."""
    from grpo.errors import RewardError
    from tests import rewards_for_tests as r

    r.counted.update(n=0, fail_from=2 * 8 + 1, sigterm_at=0)  # 2 prompts x 4 completions per step
    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, rewards="tests.rewards_for_tests:counting", max_steps=5,
                   eval_prompts=0, save_steps=save_steps)
    t = Trainer(cfg)
    with pytest.raises(RewardError) as info:
        t.train()
    step2 = t.run_dir / "checkpoints" / "step-2"
    msg = str(info.value)
    assert "reward 'tests.rewards_for_tests:counting' failed on 8 (ConnectionError: the grading service went away)" in msg
    assert msg.endswith(f"stopped after step 2, checkpoint {step2}") and "\n" not in msg
    assert [json.loads(l)["step"] for l in (t.run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert (t.run_dir / "checkpoints" / "latest").read_text().strip() == "step-2"
    import torch

    state = torch.load(step2 / "trainer_state.pt", weights_only=False)
    assert state["step"] == 2 and state["collector"]["sampler"]["position"] == 2 * 2
    assert state["collector"]["reward_failures"] == 0


def test_the_failure_share_that_stops_a_run_is_configurable(tmp_path, tiny_model_dir, tiny_dataset):
    """A reward failing on half of every step: the default (1.0: stop only when no completion could be
    scored) trains on the other half and counts the failures; max_reward_failure_share=0.5 stops at the
    first step; 0 is refused."""
    from grpo.config.io import load_config
    from grpo.errors import ConfigError, RewardError
    from tests import rewards_for_tests as r

    name = "tests.rewards_for_tests:fails_every_other_call"
    r.counted.update(n=0)
    t = Trainer(make_cfg(tmp_path / "a", tiny_model_dir, tiny_dataset, rewards=name, max_steps=2, eval_prompts=0))
    t.train()
    lines = [json.loads(l) for l in (t.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [l["reward_failures"] for l in lines] == [4, 4]
    r.counted.update(n=0)
    t = Trainer(make_cfg(tmp_path / "b", tiny_model_dir, tiny_dataset, rewards=name, max_steps=2, eval_prompts=0,
                         max_reward_failure_share=0.5))
    with pytest.raises(RewardError, match=r"^4 of the step's 8 completions could not be scored "
                                          r"\(max_reward_failure_share=0\.5\): reward '.*' failed on 4 \(ValueError: "
                                          r"flaky grader\); stopped before the first step finished"):
        t.train()
    with pytest.raises(ConfigError, match="^max_reward_failure_share: must be > 0"):
        load_config(None, ["max_reward_failure_share=0"])
