"""`module:name` references import from the folder grpo runs in, as `python -m` does, and a run
records that folder (working_dir), so that a resume or `grpo eval` started elsewhere imports the same
modules. The commands run as the installed `grpo` script does: in their own process, without the
current folder on the module path (python -P)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpo.infra.runtime import import_from
from tests.conftest import TEST_BF16, TEST_SEED

REPO = Path(__file__).resolve().parents[1]
REWARDS = '''
def f(completion, sample):
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)


def g(completions, answer, **kwargs):
    return [float(a in c) for c, a in zip(completions, answer)]
'''


def _grpo(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-P", "-m", "grpo", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_import_from_puts_folders_first_in_order(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    for folder, value in ((a, 1), (b, 2)):
        folder.mkdir()
        (folder / "which_one.py").write_text(f"VALUE = {value}\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "which_one", raising=False)
    import_from(str(a), "", str(b))
    assert sys.path[:2] == [str(a), str(b)]
    import which_one

    assert which_one.VALUE == 1
    import_from(str(b), str(a))  # again, the other way round: no duplicates
    assert sys.path[:2] == [str(b), str(a)] and sys.path.count(str(a)) == 1


@pytest.mark.slow  # four commands in their own processes
def test_train_eval_and_resume_from_another_folder_import_the_users_module(tmp_path, tiny_model_dir):
    home, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    (home / "my_rewards.py").write_text(REWARDS)
    rows = [{"prompt": f"What is {a} + {b}?", "answer": str(a + b)} for a in range(1, 7) for b in range(1, 5)]
    (home / "sums.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    args = ["train", f"model={tiny_model_dir}", f"task={home / 'sums.jsonl'}", "output_dir=run", "max_steps=1",
            "num_generations=2", "prompts_per_step=2", "max_completion_length=4", "eval_prompts=2",
            "eval_max_new_tokens=3", "eval_pass_k=0", "progress=false", "report_to=none",
            "rewards=my_rewards:f,my_rewards:g", "reward_timeout=0", f"bf16={TEST_BF16}", f"seed={TEST_SEED}"]
    train = _grpo(args, home)
    assert train.returncode == 0, train.stderr[-2000:]
    run = home / "run"
    assert yaml.safe_load((run / "config.yaml").read_text())["working_dir"] == str(home)
    evaluated = _grpo(["eval", "--model", "run"], home)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert json.loads(evaluated.stdout)["n_prompts"] == 2
    resumed = _grpo(["train", "--resume", str(run), "max_steps=2"], elsewhere)  # the run's folder, from elsewhere
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert [json.loads(l)["step"] for l in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    # without the recorded folder, elsewhere has no such module: the error names it
    moved = yaml.safe_load((run / "config.yaml").read_text())
    moved.update(working_dir="", output_dir=str(tmp_path / "other"), resume_from_checkpoint=None)
    (elsewhere / "c.yaml").write_text(yaml.safe_dump(moved))
    lost = _grpo(["train", "--config", "c.yaml"], elsewhere)
    assert lost.returncode == 2 and "No module named 'my_rewards'" in lost.stderr, lost.stderr[-2000:]
