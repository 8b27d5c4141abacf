"""Exact resume, atomic checkpoints, and explicit errors for checkpoints that cannot be resumed."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from grpo.errors import CheckpointError
from grpo.infra.checkpoint import find_latest, list_checkpoints
from grpo.train.trainer import Trainer
from tests.test_trainer import make_cfg


def weights_hash(model) -> str:
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def timeless(line: dict) -> dict:
    """A metrics line without its wall-clock figures."""
    d = dict(line)
    for k in ("step_seconds", "generation_seconds", "tokens_per_second", "grading_seconds"):  # wall-clock
        d.pop(k)
    return {k: v for k, v in d.items() if not k.startswith("time/")}  # stage timers: wall-clock too


def metric_lines(run_dir):
    return [timeless(json.loads(line)) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _cfg(tmp_path, name, model_dir, dataset, **kw):
    kw = {"eval_prompts": 0, "max_steps": 4, "num_iterations": 2, "beta": 0.05, **kw}
    return make_cfg(tmp_path / name, model_dir, dataset, **kw)


@pytest.mark.parametrize("stop_at, extra", [
    (2, {}),
    (1, {"ref_reset_steps": 1}),                          # the reference itself is part of the state
    (3, {"use_peft": True, "lora_r": 4}),                  # adapters only
    (2, {"prompts_per_step": 5, "per_device_train_batch_size": 4}),  # 20 train prompts: step 4 ends epoch 1
    (2, {"advantage_estimator": "gae", "critic_learning_rate": 1e-2}),   # PPO: the critic is state too
    (2, {"advantage_estimator": "gae", "critic_shared_trunk": True}),     # PPO, value head on the policy
], ids=["plain", "ref_reset", "lora", "epoch_end", "ppo", "ppo_shared_trunk"])
def test_resume_is_bit_exact(tmp_path, tiny_model_dir, tiny_dataset, stop_at, extra):
    full = Trainer(_cfg(tmp_path, "full", tiny_model_dir, tiny_dataset, **extra))
    full.train()
    part = Trainer(_cfg(tmp_path, "part", tiny_model_dir, tiny_dataset, max_steps=stop_at, **extra))
    part.train()
    resumed = Trainer(_cfg(tmp_path, "part", tiny_model_dir, tiny_dataset,
                           resume_from_checkpoint=str(part.run_dir), **extra))
    assert resumed.step == stop_at
    resumed.train()
    assert weights_hash(resumed.policy) == weights_hash(full.policy)
    assert metric_lines(resumed.run_dir) == metric_lines(full.run_dir)
    if full.critic is not None:  # PPO (faults.md row 40): the critic's own weights resume exactly too
        own = (lambda t: t.critic.model if t.critic.head is None else t.critic.head)  # noqa: E731
        assert weights_hash(own(resumed)) == weights_hash(own(full))


def test_resume_at_exact_end_of_epoch_trains_remaining_steps(tmp_path, tiny_model_dir, tiny_dataset):
    # 20 training prompts, 5 per step: the checkpoint after step 4 sits exactly on the epoch boundary
    kw = dict(prompts_per_step=5, per_device_train_batch_size=4, num_iterations=1)
    full = Trainer(_cfg(tmp_path, "full", tiny_model_dir, tiny_dataset, max_steps=6, **kw))
    full.train()
    part = Trainer(_cfg(tmp_path, "part", tiny_model_dir, tiny_dataset, max_steps=4, **kw))
    part.train()
    assert part.collector.sampler.state_dict()["position"] == 20
    resumed = Trainer(_cfg(tmp_path, "part", tiny_model_dir, tiny_dataset, max_steps=6,
                           resume_from_checkpoint="auto", **kw))
    resumed.train()
    assert resumed.step == 6 and len(metric_lines(resumed.run_dir)) == 6
    assert weights_hash(resumed.policy) == weights_hash(full.policy)


def test_corrupt_or_missing_latest_is_an_explicit_error(tmp_path, tiny_model_dir, tiny_dataset):
    t = Trainer(_cfg(tmp_path, "run", tiny_model_dir, tiny_dataset, max_steps=1, num_iterations=1))
    t.train()
    latest = t.run_dir / "checkpoints" / "latest"
    at = re.escape  # each message starts with the file it is about (faults.md rows 29-32)
    latest.write_text("garbage\x00\n")
    corrupt = f"^{at(str(latest))}: corrupt pointer {at(repr('garbage' + chr(0)))} \\(expected 'step-N'\\)$"
    with pytest.raises(CheckpointError, match=corrupt):
        find_latest(t.run_dir)
    latest.write_text("step-99\n")
    missing = t.run_dir / "checkpoints" / "step-99"
    with pytest.raises(CheckpointError, match=f"^{at(str(latest))} names {at(str(missing))}, which does not exist$"):
        Trainer(_cfg(tmp_path, "run", tiny_model_dir, tiny_dataset, resume_from_checkpoint=str(t.run_dir)))
    latest.unlink()
    with pytest.raises(CheckpointError, match=f"^{at(str(latest))}: no checkpoint to resume from \\(the pointer file "
                                              "is missing\\)$"):
        Trainer(_cfg(tmp_path, "run", tiny_model_dir, tiny_dataset, resume_from_checkpoint=str(t.run_dir)))
    latest.write_text("step-1\n")
    state = t.run_dir / "checkpoints" / "step-1" / "trainer_state.pt"
    state.write_bytes(b"truncated")
    with pytest.raises(CheckpointError, match=f"^{at(str(state))}: cannot be read \\("):
        Trainer(_cfg(tmp_path, "run", tiny_model_dir, tiny_dataset, resume_from_checkpoint=str(t.run_dir)))


def test_keep_newest_k(tmp_path, tiny_model_dir, tiny_dataset):
    t = Trainer(_cfg(tmp_path, "run", tiny_model_dir, tiny_dataset, max_steps=4, num_iterations=1, save_steps=1,
                     save_total_limit=2))
    t.train()
    assert [p.name for p in list_checkpoints(t.run_dir)] == ["step-3", "step-4"]
    readable = json.loads((t.run_dir / "checkpoints" / "step-4" / "trainer_state.json").read_text())
    assert readable["step"] == 4 and "optimizer" not in readable and "tensor(" not in json.dumps(readable)
    assert readable["updater"]["skipped_updates"] == 0 and "optimizer" not in readable["updater"]
    assert readable["collector"]["sampler"]["position"] == t.collector.sampler.state_dict()["position"]


_KILL_SCRIPT = """
import os, sys, time
import grpo.infra.checkpoint as ck
from tests.test_trainer import make_cfg
from grpo.train.trainer import Trainer
from pathlib import Path
real_save = ck.torch.save
def slow_save(obj, path, *a, **k):
    real_save(obj, path, *a, **k)
    if "step-2" in str(path):             # the second checkpoint: die halfway through writing it
        Path(sys.argv[3]).write_text("writing")
        time.sleep(60)
ck.torch.save = slow_save
cfg = make_cfg(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[4]), eval_prompts=0, max_steps=3, save_steps=1)
Trainer(cfg).train()
"""


def test_sigkill_during_checkpoint_write_keeps_previous(tmp_path, tiny_model_dir, tiny_dataset, capsys):
    """A run killed while writing its step-2 checkpoint: step-1 and the pointer stay intact, the partial
    .tmp-step-2 folder is reported by name, and the resumed run's metrics.jsonl (step 2 is retrained and
    logged) equals an uninterrupted run's."""
    flag = tmp_path / "flag"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen([sys.executable, "-c", _KILL_SCRIPT, str(tmp_path), str(tiny_model_dir), str(flag),
                             str(tiny_dataset)], env=env)
    deadline = time.time() + 120
    while not flag.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert flag.exists(), "the child never reached the second checkpoint write"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    run = tmp_path / "run"
    # a step's line follows its checkpoint (whose seconds it holds, time/checkpoint_seconds): none for step 2
    assert [l["step"] for l in metric_lines(run)] == [1]
    assert find_latest(run).name == "step-1"  # the pointer still names the complete checkpoint
    assert any(p.name.startswith(".tmp-step-2") for p in (run / "checkpoints").iterdir())
    resumed = Trainer(make_cfg(tmp_path, tiny_model_dir, tiny_dataset, eval_prompts=0, max_steps=3, save_steps=1,
                               resume_from_checkpoint="auto"))
    assert resumed.step == 1
    capsys.readouterr()
    resumed.train()
    assert resumed.step == 3 and [l["step"] for l in metric_lines(run)] == [1, 2, 3]
    full = Trainer(make_cfg(tmp_path / "full", tiny_model_dir, tiny_dataset, eval_prompts=0, max_steps=3, save_steps=1))
    full.train()
    assert metric_lines(run) == metric_lines(full.run_dir)
    out = capsys.readouterr().out  # the unfinished write is reported, by name
    assert any(".tmp-step-2" in line and "did not finish" in line for line in out.splitlines()), out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])  # stable ids on any Python
def test_signal_saves_and_exits_cleanly(tmp_path, tiny_model_dir, tiny_dataset, sig):
    t = Trainer(_cfg(tmp_path, "run", tiny_model_dir, tiny_dataset, max_steps=50, num_iterations=1))
    real_step = t.train_step

    def step_then_interrupt():
        out = real_step()
        if t.step == 2:
            os.kill(os.getpid(), sig)
        return out

    t.train_step = step_then_interrupt
    previous = signal.getsignal(sig)
    result = t.train()
    assert result["interrupted"] == sig.name and t.step == 2
    assert find_latest(t.run_dir).name == "step-2"
    assert signal.getsignal(sig) is previous  # the caller's handler is restored
    assert "after" not in result  # no evaluation on the way out


def test_non_finite_gradients_skip_then_abort(tmp_path, tiny_model_dir, tiny_dataset, monkeypatch):
    import grpo.core

    real = grpo.core.policy_loss
    poison = {"on": False}

    def maybe_nan(*a, **k):  # a loss that goes non-finite from the second step on
        out = real(*a, **k)
        if poison["on"]:
            out["loss"] = out["loss"] * float("nan")
        return out

    monkeypatch.setattr(grpo.core, "policy_loss", maybe_nan)
    t = Trainer(_cfg(tmp_path, "run", tiny_model_dir, tiny_dataset, max_steps=10, num_iterations=1,
                     max_consecutive_skips=2))
    t.logger = type("Quiet", (), {"note": lambda *a: None, "log_samples": lambda *a: None})()
    t.train_step()
    after_good_step = weights_hash(t.policy)
    poison["on"] = True
    t.train_step()  # skipped: the weights stay as they were
    assert t.updater.skipped_updates == 1 and weights_hash(t.policy) == after_good_step
    with pytest.raises(FloatingPointError, match="2 consecutive updates"):
        t.train_step()
    assert t.updater.skipped_updates == 2 and weights_hash(t.policy) == after_good_step


def test_finite_loss_with_a_non_finite_gradient_skips_the_update(tmp_path, tiny_model_dir, tiny_dataset):
    """A finite loss can still give a non-finite gradient norm (an overflow inside the backward): the
    update is skipped and counted all the same, and the next good step trains and resets the run of
    skips."""
    import math

    import torch

    kw = dict(max_steps=10, num_iterations=1, skip_zero_advantage=False)  # every step runs a backward
    t = Trainer(_cfg(tmp_path, "run", tiny_model_dir, tiny_dataset, **kw))
    t.logger = type("Quiet", (), {"note": lambda *a: None, "log_samples": lambda *a: None})()
    t.train_step()
    before = weights_hash(t.policy)
    param = next(p for p in t.policy.parameters() if p.requires_grad)
    hook = param.register_hook(lambda g: torch.full_like(g, float("inf")))  # this parameter's gradient overflows
    m = t.train_step()
    hook.remove()
    assert math.isfinite(m["loss"]) and not math.isfinite(m["grad_norm"])
    assert t.updater.skipped_updates == 1 and t.updater.consecutive_skips == 1 and weights_hash(t.policy) == before
    t.train_step()
    assert t.updater.skipped_updates == 1 and t.updater.consecutive_skips == 0 and weights_hash(t.policy) != before


def test_resume_with_another_model_is_refused(tmp_path, tiny_model_dir, tiny_dataset):
    t = Trainer(_cfg(tmp_path, "run", tiny_model_dir, tiny_dataset, max_steps=1, num_iterations=1))
    t.train()
    other = tmp_path / "other-model"
    import shutil

    shutil.copytree(tiny_model_dir, other)
    with pytest.raises(CheckpointError, match=f"^{re.escape(str(t.run_dir / 'checkpoints' / 'step-1'))}: was trained "
                                              f"from model {re.escape(repr(str(tiny_model_dir)))}, but this config's "
                                              f"model is {re.escape(repr(str(other)))}$"):  # both models named
        Trainer(_cfg(tmp_path, "run", other, tiny_dataset, resume_from_checkpoint=str(t.run_dir)))


def test_resume_with_a_controller_the_run_did_not_have_names_the_part(tmp_path, tiny_model_dir, tiny_dataset):
    """A run without controllers resumed with kl_target (an adaptive beta): the checkpoint holds no
    state for it, and the error says which part does not fit, instead of a KeyError traceback."""
    t = Trainer(_cfg(tmp_path, "run", tiny_model_dir, tiny_dataset, max_steps=1, num_iterations=1))
    t.train()
    with pytest.raises(CheckpointError, match=r"step-1: the state of 'knobs' does not fit this config \(KeyError: "
                                              r"'beta'\); resume with the settings the run started with$"):
        Trainer(_cfg(tmp_path, "run", tiny_model_dir, tiny_dataset, num_iterations=1, kl_target=0.01,
                     resume_from_checkpoint=str(t.run_dir)))


def test_a_checkpoint_with_the_flat_state_layout_still_resumes(tmp_path, tiny_model_dir, tiny_dataset):
    """Checkpoints whose trainer_state.pt is one flat dict ("sampler", "optimizer", ..., the controllers
    under "stateful"), as runs wrote before the state was kept per component, resume to the same next
    step as the same checkpoint in the current layout."""
    import shutil

    import torch

    kw = dict(num_iterations=2, clip_target_band=[0.0, 0.1])  # an optimizer, a schedule and a controller
    t = Trainer(_cfg(tmp_path, "a", tiny_model_dir, tiny_dataset, max_steps=1, **kw))
    t.train()
    copy = tmp_path / "b" / t.run_dir.name  # where _cfg(tmp_path, "b", ...) puts its run
    shutil.copytree(t.run_dir, copy)
    path = copy / "checkpoints" / "step-1" / "trainer_state.pt"
    state = torch.load(path, weights_only=False)
    flat = {k: v for k, v in state.items() if k not in ("collector", "updater", "knobs")}
    flat.update(state["collector"])
    flat.update(state["updater"])
    flat["stateful"] = {"stability": state["knobs"]}
    torch.save(flat, path)
    nxt = [Trainer(_cfg(tmp_path, name, tiny_model_dir, tiny_dataset, max_steps=2, resume_from_checkpoint="auto",
                        **kw)).train_step() for name in ("a", "b")]
    timing = ("seconds", "tokens_per_second")
    diff = {k: (v, nxt[1].get(k)) for k, v in nxt[0].items() if not any(w in k for w in timing) and v != nxt[1].get(k)}
    assert not diff, diff


@pytest.mark.parametrize("change, message", [
    ("num_iterations", "1 optimizer steps per training step, this config takes 2"),  # the schedule's unit
    ("data", "dataset of 24 prompts, this one has 25; resume with the data"),
])
def test_resume_with_a_changed_run_is_refused(tmp_path, tiny_model_dir, tiny_dataset, change, message):
    t = Trainer(_cfg(tmp_path, "run", tiny_model_dir, tiny_dataset, max_steps=1, num_iterations=1))
    t.train()
    if change == "data":
        with open(tiny_dataset, "a") as f:
            f.write('{"prompt": "What is 9 + 9?", "answer": "18"}\n')
    with pytest.raises(CheckpointError, match=message):
        Trainer(_cfg(tmp_path, "run", tiny_model_dir, tiny_dataset, num_iterations=2 if change == "num_iterations" else 1,
                     resume_from_checkpoint=str(t.run_dir)))


def test_fresh_run_refuses_an_existing_run_folder(tmp_path, tiny_model_dir, tiny_dataset):
    from grpo.config import ConfigError

    t = Trainer(_cfg(tmp_path, "run", tiny_model_dir, tiny_dataset, max_steps=1, num_iterations=1))
    t.train()
    before = (t.run_dir / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError, match="already holds a run"):
        Trainer(_cfg(tmp_path, "run", tiny_model_dir, tiny_dataset, max_steps=1, num_iterations=1))
    assert (t.run_dir / "metrics.jsonl").read_text() == before  # nothing already written is lost


_DIE_WRITING_A_LINE = """
import json, os, signal, sys
from pathlib import Path
from grpo.infra import logger
from grpo.train.trainer import Trainer
from tests.test_trainer import make_cfg
real = logger.RunLogger.log_step
def log_step(self, step, metrics):
    if step == 4:  # killed halfway through writing step 4's line, two steps after the step-2 checkpoint
        line = json.dumps({"step": step, **{k: logger._clean(v) for k, v in metrics.items()}})
        with self.metrics_path.open("a") as f:
            f.write(line[:len(line) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    real(self, step, metrics)
logger.RunLogger.log_step = log_step
Trainer(make_cfg(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), **json.loads(sys.argv[4]))).train()
"""


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_resume_drops_every_log_line_past_the_checkpoint_and_a_cut_last_line(tmp_path, tiny_model_dir, tiny_dataset,
                                                                             capsys):
    """faults.md row 36. A run that checkpoints every 2 steps, evaluates and logs samples every step, is
    SIGKILLed while writing step 4's metrics line: its logs hold steps 3 and 4 past the step-2
    checkpoint (metrics.jsonl a whole step-3 line and half a step-4 line). The resume drops them all
    (saying so once for the cut line); the resumed run logs steps 3 and 4 again, once each, equal to
    the lines the killed run wrote (the resume is exact)."""
    kw = dict(max_steps=4, save_steps=2, eval_steps=1, eval_prompts=2, eval_pass_k=0, log_completions_steps=1)
    proc = subprocess.run([sys.executable, "-c", _DIE_WRITING_A_LINE, str(tmp_path), str(tiny_model_dir),
                           str(tiny_dataset), json.dumps(kw)], env={**os.environ, "PYTHONPATH": os.getcwd()},
                          timeout=300)
    assert proc.returncode == -signal.SIGKILL
    run = tmp_path / "run"
    assert find_latest(run).name == "step-2"
    killed = {name: (run / name).read_text() for name in ("metrics.jsonl", "samples.jsonl", "eval_completions.jsonl")}
    assert not killed["metrics.jsonl"].endswith("\n") and killed["metrics.jsonl"].count("\n") == 3  # 1-3, half of 4
    assert {r["step"] for r in _rows(run / "samples.jsonl")} == {r["step"] for r in _rows(run / "eval_completions.jsonl")} \
        == {1, 2, 3, 4}
    capsys.readouterr()
    resumed = Trainer(make_cfg(tmp_path, tiny_model_dir, tiny_dataset, resume_from_checkpoint="auto", **kw))
    out = capsys.readouterr().out
    assert resumed.step == 2
    assert [line for line in out.splitlines() if "cut short" in line] == [
        f"resuming {run}: dropped a last line cut short in metrics.jsonl"]
    for name in killed:  # nothing past the checkpoint is left
        assert {r["step"] for r in _rows(run / name)} == {1, 2}, name
    resumed.train()
    # each step's lines once, in order, equal to those the killed run wrote (all but its half line)
    wrote = {name: [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]
             for name, text in killed.items()}
    for name in ("samples.jsonl", "eval_completions.jsonl"):
        assert _rows(run / name) == wrote[name], name
    assert [line["step"] for line in metric_lines(run)] == [1, 2, 3, 4]
    assert metric_lines(run)[:3] == [timeless(line) for line in wrote["metrics.jsonl"]]
