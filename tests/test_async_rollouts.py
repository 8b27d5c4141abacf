"""Asynchronous rollouts on the real trainer, engine process and rewards: K = 0 is the synchronous run
exactly; the staleness bound holds (admission and drops); resume draws no prompt twice and loses none."""

from __future__ import annotations

import json

import pytest
import torch

from grpo.train.metrics_catalog import lookup
from grpo.train.trainer import Trainer
from tests.conftest import TEST_SEED
from tests.test_trainer import make_cfg


class Recording(Trainer):
    """The trainer, keeping every batch's prompt and completion ids."""

    def prepare(self, ro, *args, **kw):
        self.seen = getattr(self, "seen", []) + [(ro.prompt_ids.clone(), ro.completion_ids.clone())]
        return super().prepare(ro, *args, **kw)


def _same_batches(a: Recording, b: Recording) -> None:
    assert len(a.seen) == len(b.seen)
    for (pa, ca), (pb, cb) in zip(a.seen, b.seen):
        assert torch.equal(pa, pb) and torch.equal(ca, cb)


def _lines(run_dir):
    """The run's metrics lines; every key is one the metrics catalog names."""
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    unknown = sorted({k for line in lines for k in line if lookup(k) is None})
    assert not unknown, f"metrics.jsonl keys missing from grpo/train/metrics_catalog.py: {unknown}"
    return lines


@pytest.mark.parametrize("backend", ["fast", "hf"])
def test_max_staleness_zero_is_the_synchronous_run(tmp_path, tiny_model_dir, tiny_dataset, backend):
    """K = 0: the producer draws step d only with the weights of step d, keyed as the synchronous
    loop keys it, and no token is stale, so no correction applies: the same completions at every
    step and the same final weights, bit for bit."""
    kw = dict(max_steps=3, rollout_backend=backend, decode_kernels="mkl", eval_prompts=0, log_completions_steps=1,
              async_engine_threads=1)
    sync = Recording(make_cfg(tmp_path / "sync", tiny_model_dir, tiny_dataset, **kw))
    sync.train()
    asyn = Recording(make_cfg(tmp_path / "async", tiny_model_dir, tiny_dataset, async_rollouts=True, max_staleness=0,
                              **kw))
    asyn.train()
    _same_batches(sync, asyn)
    for (name, a), b in zip(sync.policy.named_parameters(), asyn.policy.parameters()):
        assert torch.equal(a, b), name
    lines = _lines(asyn.run_dir)
    assert [l["async/staleness_max"] for l in lines] == [0, 0, 0]
    assert all(l["async/stale_token_share"] == 0.0 and l["async/dropped_groups"] == 0 for l in lines)


def _train_twice(cfg) -> Recording:
    """One step, then (max_steps raised) a second train() on the same trainer."""
    t = Recording(cfg)
    t.train()
    t.cfg.max_steps = 2
    t.train()
    return t


def test_a_second_train_starts_the_engine_process_and_the_producer_where_the_stream_stood(
        tmp_path, tiny_model_dir, tiny_dataset):
    """train() ends with the engine process closed and the producer stopped; a later train() starts
    both again, the process on the weights trained so far and the producer at the prompt stream's
    position: at K = 0 the same tokens and weights as the synchronous trainer trained twice."""
    kw = dict(max_steps=1, rollout_backend="hf", eval_prompts=0, async_engine_threads=1)
    sync = _train_twice(make_cfg(tmp_path / "sync", tiny_model_dir, tiny_dataset, **kw))
    asyn = Recording(make_cfg(tmp_path / "async", tiny_model_dir, tiny_dataset, async_rollouts=True, max_staleness=0,
                              **kw))
    asyn.train()
    first = [e.process.proc for e in asyn.engines.opened() if e.name == "process"]
    assert len(first) == 1 and not first[0].is_alive() and not asyn.async_rollouts.threads
    asyn.cfg.max_steps = 2
    asyn.train()
    second = [e.process.proc for e in asyn.engines.opened() if e.name == "process"]
    assert second[0] is not first[0] and not second[0].is_alive()
    _same_batches(sync, asyn)
    for (name, a), b in zip(sync.policy.named_parameters(), asyn.policy.parameters()):
        assert torch.equal(a, b), name


def _prompts_per_step(t: Recording) -> list[torch.Tensor]:
    return [p for p, _ in t.seen]


def test_staleness_bound_holds_and_a_resume_draws_every_prompt_once(tmp_path, tiny_model_dir, tiny_dataset):
    """K = 1 with a reward that waits: the producer draws the next step with the weights of the step
    being trained, so samples of staleness 1 are trained (and corrected), none over 1. Stopped after 2
    steps with draws queued and resumed for 2 more, the run trains the prompt stream of the
    synchronous run step for step: no draw lost, none twice."""
    kw = dict(rollout_backend="hf", eval_prompts=0, rewards="tests.async_rewards:slow_digit_share",
              async_engine_threads=1, rollout_correction_level="token")
    sync = Recording(make_cfg(tmp_path / "sync", tiny_model_dir, tiny_dataset, max_steps=4, **kw))
    sync.train()
    first = Recording(make_cfg(tmp_path / "async", tiny_model_dir, tiny_dataset, max_steps=2, async_rollouts=True,
                               max_staleness=1, **kw))
    first.train()
    lines = _lines(first.run_dir)
    again = Recording(make_cfg(tmp_path / "async", tiny_model_dir, tiny_dataset, max_steps=4, async_rollouts=True,
                               max_staleness=1, resume_from_checkpoint="auto", **kw))
    again.train()
    lines += _lines(again.run_dir)[2:]
    assert len(lines) == 4
    assert all(l["async/staleness_max"] <= 1 and l["async/staleness_over"] == 0 for l in lines)
    assert lines[1]["async/staleness_1"] > 0, "step 1 trained nothing drawn while step 0 trained"
    assert lines[1]["async/stale_token_share"] > 0 and "async/mismatch_kl_k3" in lines[1]
    # the correction read the update's own forward: no inference forward over the batch before it
    assert all(l["time/old_logp_seconds"] == 0.0 for l in lines)
    stream = _prompts_per_step(first) + _prompts_per_step(again)
    assert len(stream) == 4
    for s, (a, b) in enumerate(zip(_prompts_per_step(sync), stream)):
        assert torch.equal(a, b), f"step {s} trained other prompts than the synchronous run's"


def test_groups_over_the_bound_are_dropped_and_counted():
    """take_batch keeps drawing until B groups are within the bound; the staler ones are dropped."""
    from grpo.rollout.base import Rollout
    from grpo.train.async_rollouts import Group, take_batch

    def group(draw: int, version_of_rows: list[int]) -> Group:
        g = len(version_of_rows)
        versions = torch.tensor(version_of_rows)[:, None].expand(g, 3).clone()  # [G, T]
        ro = Rollout(torch.zeros(g, 2, dtype=torch.long), torch.ones(g, 2, dtype=torch.long),
                     torch.zeros(g, 3, dtype=torch.long), torch.ones(g, 3, dtype=torch.long),
                     torch.zeros(g, dtype=torch.bool), None, [""] * g, "test", 0.0, versions=versions)
        return Group(draw, 0, {}, ro, torch.zeros(g), torch.zeros(g, 1), {}, {})

    queue = iter([group(0, [4, 4]), group(1, [2, 5]), group(2, [3, 3]), group(3, [5, 4]), group(4, [5, 5])])
    got = take_batch(lambda: next(queue), count=3, step=5, max_staleness=2, group_size=2)
    assert [x.draw for x in got.kept] == [0, 2, 3] and [x.draw for x in got.dropped] == [1]
    assert got.staleness == [1, 3, 2, 1]  # a group's oldest token decides: draw 1 has one of version 2


def test_tool_episodes_run_through_the_engine_process(tmp_path, tiny_model_dir):
    """Multi-turn episodes (the calculator) sample turn by turn through the engine process: the
    episodes call the tool, every turn's tokens carry a version, and the bound holds."""
    from grpo.config import Config
    from tests.test_agent_training import _teach_to_call, calculator_prompt_limit

    cfg = Config(model=str(tmp_path / "caller"), task="calculator", tools="builtin:calculator", max_turns=3,
                 max_prompt_length=calculator_prompt_limit(tiny_model_dir), output_dir=str(tmp_path / "run"),
                 max_steps=2, num_generations=2,
                 prompts_per_step=2, per_device_train_batch_size=4, max_completion_length=48, eval_prompts=0,
                 learning_rate=1e-3, progress=False, report_to="none", seed=TEST_SEED, reward_timeout=0.0,
                 rollout_backend="hf", async_rollouts=True, max_staleness=1, async_engine_threads=1)
    _teach_to_call(tiny_model_dir, tmp_path / "caller", cfg)
    Trainer(cfg).train()
    lines = _lines(tmp_path / "run")
    assert [line["step"] for line in lines] == [1, 2]
    for line in lines:
        assert line["tools/call_rate"] > 0 and line["tools/turns"] > 1, line
        assert line["async/staleness_max"] <= 1


@pytest.mark.parametrize("settings, field", [
    (dict(task="arithmetic:0.5,calculator:0.5"), "task"),
    (dict(environment_factory="a=tests.mixture_envs_for_tests:AdderEnv"), "task"),
    (dict(teacher="some/teacher", max_staleness=1), "teacher"),
    (dict(difficulty_sampling=True), "difficulty_sampling"),
    (dict(dynamic_sampling=True), "dynamic_sampling"),
    (dict(reward_model_train_steps=2, ref_reset_steps=2, rewards="reward_model", reward_model="some/rm"),
     "reward_model_train_steps"),
    (dict(use_peft=True), "use_peft"),
    (dict(use_peft=True, load_in_4bit=True), "load_in_4bit"),
])
def test_what_async_rollouts_do_not_run_with_is_refused_before_anything_loads(settings, field):
    """A mixture or a routed environment (per-source verdicts and metrics are the synchronous step's),
    distillation with stale tokens (the correction weighs advantages, the teacher term reads none), the
    difficulty sampler and dynamic sampling are refused with async_rollouts, naming the field."""
    from grpo.config import Config
    from grpo.config.validate import validate
    from grpo.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"^{field}: .*async_rollouts"):
        validate(Config(async_rollouts=True, **settings))
    validate(Config(async_rollouts=True, teacher="some/teacher", max_staleness=0))


def test_async_rollouts_on_two_processes_is_refused_before_anything_loads():
    from grpo.config import Config
    from grpo.config.validate import validate_world
    from grpo.errors import ConfigError

    cfg = Config(async_rollouts=True)
    validate_world(cfg, 1)
    with pytest.raises(ConfigError, match=r"^async_rollouts: runs on one process only"):
        validate_world(cfg, 2)


def test_partial_rollouts_reach_the_engine_process(tmp_path, tiny_model_dir, tiny_dataset):
    """partial_rollouts is wired through the trainer to the engine process: its segment length is
    partial_rollout_tokens with it, 0 (each call finishes under its weights) without."""
    for partial, want in ((True, 3), (False, 0)):
        t = Trainer(make_cfg(tmp_path / str(partial), tiny_model_dir, tiny_dataset, eval_prompts=0, max_steps=1,
                             async_rollouts=True, partial_rollouts=partial, partial_rollout_tokens=3,
                             rollout_backend="hf", async_engine_threads=1))
        try:
            assert t.engines.process.segment_tokens == want
        finally:
            t.close()
