"""Asynchronous rollouts on the real trainer, engine process and rewards: K = 0 is the synchronous run
exactly; the staleness bound holds (admission and drops); resume draws no prompt twice and loses none
(several processes: tests/test_distributed.py)."""

from __future__ import annotations

import json
import math

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


def _k_zero_is_sync(tmp_path, model_dir, dataset, **kw) -> tuple[Recording, Recording]:
    """A synchronous run and an asynchronous one at K = 0 of the same settings, which trained the same
    prompts and completions at every step and ended with the same weights, bit for bit."""
    sync = Recording(make_cfg(tmp_path / "sync", model_dir, dataset, **kw))
    sync.train()
    asyn = Recording(make_cfg(tmp_path / "async", model_dir, dataset, async_rollouts=True, max_staleness=0, **kw))
    asyn.train()
    _same_batches(sync, asyn)
    for (name, a), b in zip(sync.policy.named_parameters(), asyn.policy.parameters()):
        assert torch.equal(a, b), name
    return sync, asyn


@pytest.mark.parametrize("backend", ["fast", "hf"])
def test_max_staleness_zero_is_the_synchronous_run(tmp_path, tiny_model_dir, tiny_dataset, backend):
    """K = 0: the producer draws step d only with the weights of step d, keyed as the synchronous
    loop keys it, and no token is stale, so no correction applies: the same completions at every
    step and the same final weights, bit for bit."""
    _, asyn = _k_zero_is_sync(tmp_path, tiny_model_dir, tiny_dataset, max_steps=3, rollout_engine=backend,
                              decode_kernels="mkl", eval_prompts=0, log_completions_steps=1, async_engine_threads=1)
    lines = _lines(asyn.run_dir)
    assert [l["async/staleness_max"] for l in lines] == [0, 0, 0]
    assert all(l["async/stale_token_share"] == 0.0 and l["async/dropped_groups"] == 0 for l in lines)


@pytest.mark.parametrize("backend", ["fast", "hf"])
def test_with_lora_max_staleness_zero_is_the_synchronous_run_and_moves_only_the_adapters(
        tmp_path, tiny_model_dir, tiny_dataset, backend):
    """LoRA: the engine process builds the policy's adapters on its own base, takes every weight once,
    then only the adapters after each step; with K = 0 it samples what the synchronous loop samples,
    so the same completions and the same adapter weights, bit for bit."""
    kw = dict(max_steps=3, rollout_engine=backend, decode_kernels="mkl", eval_prompts=0, async_engine_threads=1,
              use_peft=True, lora_r=4, lora_alpha=8)
    sync = Recording(make_cfg(tmp_path / "sync", tiny_model_dir, tiny_dataset, **kw))
    sync.train()
    asyn = Recording(make_cfg(tmp_path / "async", tiny_model_dir, tiny_dataset, async_rollouts=True, max_staleness=0,
                              **kw))
    process = asyn.engines.train.process  # kept after close(): what the last publish moved
    asyn.train()
    _same_batches(sync, asyn)
    trained = {n: p for n, p in sync.policy.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)
    for name, p in asyn.policy.named_parameters():
        if name in trained:
            assert torch.equal(p, trained[name]), name
    adapters = sum(p.numel() * p.element_size() for p in trained.values())
    everything = sum(p.numel() * p.element_size() for p in asyn.policy.parameters())
    assert process.last_publish_bytes == adapters < everything / 2  # the frozen base went once


def test_with_qlora_the_engine_process_samples_the_dequantized_base_and_gets_only_the_adapters(
        tmp_path, tiny_model_dir, tiny_dataset):
    """QLoRA: the engine process holds the 4-bit base dequantized (bitsandbytes' own values), sent once,
    and the adapters after each step; two steps train with finite metrics, and the engine's base equals
    the policy's dequantized base."""
    pytest.importorskip("bitsandbytes")
    from grpo.rollout.producer import _views
    from grpo.rollout.whole import whole_weights

    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, async_rollouts=True, max_staleness=1, max_steps=2,
                   eval_prompts=0, use_peft=True, lora_r=4, lora_alpha=8, load_in_4bit=True, rollout_engine="hf",
                   async_engine_threads=1)
    t = Trainer(cfg)
    process = t.engines.train.process
    quantized = [n for n, p in t.policy.named_parameters() if getattr(p, "quant_state", None) is not None]
    assert quantized
    shared = _views(process.flat, process.layout)
    for name, value in whole_weights(t.policy, set(quantized)).items():
        assert value.dtype.is_floating_point and torch.equal(shared[name], value), name
    name = quantized[0]  # what the engine holds is what the 4-bit layer multiplies by
    layer = t.policy.get_submodule(name.removesuffix(".weight"))
    x = torch.randn(3, shared[name].shape[1])
    with torch.no_grad():
        torch.testing.assert_close(torch.nn.functional.linear(x, shared[name], layer.bias), layer(x),
                                   rtol=1e-4, atol=1e-5)
    t.train()
    lines = _lines(t.run_dir)
    assert len(lines) == 2 and all(torch.isfinite(torch.tensor(l["loss"])) for l in lines)
    adapters = sum(p.numel() * p.element_size() for p in t.policy.parameters() if p.requires_grad)
    assert process.last_publish_bytes == adapters


def test_a_mixture_with_k_zero_is_the_synchronous_run_with_its_per_source_metrics(tmp_path, tiny_model_dir):
    """A mixture of a plain task and a tool task (each row routed to its source's rewards and tools)
    through the engine process: with K = 0 the same completions, weights, accuracy and per-source
    metrics as the synchronous step, computed over the groups the step trains."""
    kw = dict(task="arithmetic:0.5,calculator:0.5", eval_prompts=0, max_steps=3, rollout_engine="hf",
              max_completion_length=8, async_engine_threads=1)
    sync = Recording(make_cfg(tmp_path / "sync", tiny_model_dir, None, **kw))
    sync.train()
    asyn = Recording(make_cfg(tmp_path / "async", tiny_model_dir, None, async_rollouts=True, max_staleness=0, **kw))
    asyn.train()
    _same_batches(sync, asyn)
    for (name, a), b in zip(sync.policy.named_parameters(), asyn.policy.parameters()):
        assert torch.equal(a, b), name
    per_source = ("share/", "reward/", "accuracy/", "rewards/", "accuracy")
    for a, b in zip(_lines(sync.run_dir), _lines(asyn.run_dir)):
        mine = {k: v for k, v in a.items() if k.startswith(per_source)}
        assert any(k.startswith("share/") for k in mine)
        assert {k: b.get(k) for k in mine} == mine


def test_routed_environments_run_through_the_engine_process(tmp_path, tiny_model_dir):
    """TRL's dict environment_factory under async_rollouts: each row's episode runs in its own
    environment (a wrong one raises, a counted failure) and the step logs each source's share."""
    from grpo.api import GRPOConfig, GRPOTrainer
    from tests import mixture_envs_for_tests as envs

    args = GRPOConfig(output_dir=str(tmp_path / "run"), max_steps=2, num_generations=4, per_device_train_batch_size=4,
                      max_completion_length=8, eval_prompts=0, learning_rate=1e-2, temperature=1.0, progress=False,
                      report_to="none", reward_timeout=0.0, seed=TEST_SEED, prompts_per_step=4, async_rollouts=True,
                      max_staleness=1, rollout_engine="hf", async_engine_threads=1)
    trainer = GRPOTrainer(model=str(tiny_model_dir), reward_funcs=[envs.arithmetic_reward, envs.calculator_reward],
                          args=args, train_dataset=envs.rows(),
                          environment_factory={"arithmetic": envs.AdderEnv, "calculator": envs.MultiplierEnv})
    trainer.train()
    lines = _lines(trainer.run_dir)
    assert [line["step"] for line in lines] == [1, 2]
    for line in lines:
        assert line["reward_failures"] == 0 and line["share/arithmetic"] + line["share/calculator"] == 1.0, line


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
    kw = dict(max_steps=1, rollout_engine="hf", eval_prompts=0, async_engine_threads=1)
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
    kw = dict(rollout_engine="hf", eval_prompts=0, rewards="tests.async_rewards:slow_digit_share",
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


def test_with_a_teacher_stale_tokens_weigh_the_distillation_term(tmp_path, tiny_model_dir, tiny_dataset, monkeypatch):
    """On-policy distillation at K = 1 with a reward that waits: the tokens drawn by the previous
    step's weights reach the distill loss with their importance weights (LossInputs.weight, not all
    1), as the advantages do; the run trains with finite metrics."""
    import grpo.core as core_module

    seen = []
    real = core_module.policy_loss

    def spy(*args, weight=None, **kw):
        seen.append(None if weight is None else weight.detach().clone())
        return real(*args, weight=weight, **kw)

    monkeypatch.setattr(core_module, "policy_loss", spy)
    t = Trainer(make_cfg(tmp_path, tiny_model_dir, tiny_dataset, max_steps=3, async_rollouts=True, max_staleness=1,
                         policy_loss="distill", teacher=str(tiny_model_dir), beta=0.0, rollout_engine="hf",
                         eval_prompts=0, rewards="tests.async_rewards:slow_digit_share", async_engine_threads=1,
                         rollout_correction_level="token"))
    t.train()
    lines = _lines(t.run_dir)
    assert any(l["async/stale_token_share"] > 0 for l in lines) and all(math.isfinite(l["loss"]) for l in lines)
    weighted = [w for w in seen if w is not None]
    assert weighted and any(bool((w != 1).any()) for w in weighted)


def test_groups_over_the_bound_are_dropped_and_counted():
    """take_batch keeps drawing until B groups are within the bound; the staler ones are dropped."""
    from grpo.rollout.types import Rollout
    from grpo.train.async_queue import Group, take_batch

    def group(draw: int, version_of_rows: list[int]) -> Group:
        g = len(version_of_rows)
        versions = torch.tensor(version_of_rows)[:, None].expand(g, 3).clone()  # [G, T]
        ro = Rollout(torch.zeros(g, 2, dtype=torch.long), torch.ones(g, 2, dtype=torch.long),
                     torch.zeros(g, 3, dtype=torch.long), torch.ones(g, 3, dtype=torch.long),
                     torch.zeros(g, dtype=torch.bool), None, [""] * g, "test", 0.0, versions=versions)
        return Group(draw, 0, {}, ro, torch.zeros(g), torch.zeros(g, 1), torch.zeros(g, dtype=torch.bool),
                     torch.zeros(g, dtype=torch.float64), torch.zeros(g, 1, dtype=torch.float64), {}, {})

    queue = iter([group(0, [4, 4]), group(1, [2, 5]), group(2, [3, 3]), group(3, [5, 4]), group(4, [5, 5])])
    got = take_batch(lambda: next(queue), count=3, step=5, max_staleness=2, group_size=2)
    assert [x.draw for x in got.kept] == [0, 2, 3] and [x.draw for x in got.dropped] == [1]
    assert got.staleness == [1, 3, 2, 1]  # a group's oldest token decides: draw 1 has one of version 2


def test_the_stream_of_several_processes_is_merged_from_the_oldest_draw():
    """Two processes of a draw of 4 groups (rank 0: groups 0-1, rank 1: 2-3). Rank 1 took all its
    groups of draws 5 and 6 (its stream starts at 7) while rank 0 still waits on group 1 of draw 5:
    the merged stream starts at draw 5 with rank 0's sampler position, and marks done what either
    trained, rank 1's groups of draws 5 and 6 included, so a resume on any number of processes draws
    only rank 0's group 1 of draw 5 (and what neither took of later draws) again."""
    from grpo.train.async_queue import merged_stream

    rank0 = {"first_draw": 5, "sampler": "at 5", "done": [(5, 0), (6, 0), (6, 1)], "mine": [0, 1],
             "observed": {3: [0.5], 4: [1.0], 5: [0.0], 6: [0.25]}}
    rank1 = {"first_draw": 7, "sampler": "at 7", "done": [(7, 3)], "mine": [2, 3], "observed": {5: [0.0], 6: [0.25]}}
    got = merged_stream([rank0, rank1])
    assert got == {"first_draw": 5, "sampler": "at 5",
                   "done": [(5, 0), (5, 2), (5, 3), (6, 0), (6, 1), (6, 2), (6, 3), (7, 3)],
                   "observed": rank0["observed"]}  # the pass rates the oldest stream replays
    assert merged_stream([rank1, rank0]) == got  # whichever process comes first
    assert merged_stream([rank0]) == {"first_draw": 5, "sampler": "at 5", "done": [(5, 0), (6, 0), (6, 1)],
                                      "observed": rank0["observed"]}


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
                 rollout_engine="hf", async_rollouts=True, max_staleness=1, async_engine_threads=1)
    _teach_to_call(tiny_model_dir, tmp_path / "caller", cfg)
    Trainer(cfg).train()
    lines = _lines(tmp_path / "run")
    assert [line["step"] for line in lines] == [1, 2]
    for line in lines:
        assert line["tools/call_rate"] > 0 and line["tools/turns"] > 1, line
        assert line["async/staleness_max"] <= 1


# both samplers at once, each acting in the run (the assertions below check that each did): a producer that
# broke either's keying would part from the synchronous run (the samplers alone: tests/test_mixture_training.py)
SAMPLERS = {"both": dict(difficulty_sampling=True, difficulty_memory=2, dynamic_sampling=True,
                         dynamic_sampling_rounds=3)}


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_with_the_samplers_k_zero_is_the_synchronous_run(tmp_path, tiny_model_dir, tiny_dataset, sampler):
    """K = 0 with the difficulty sampler (each draw hears of the draw K + 1 = 1 before it, as the
    synchronous loop's next draw does) and with dynamic sampling (the producer's draws are the step's
    rounds, keyed as the synchronous loop keys them): the same prompts and completions at every
    step, the same dynamic-sampling figures and the same final weights, bit for bit."""
    kw = dict(max_steps=4, rollout_engine="hf", eval_prompts=0, async_engine_threads=1, **SAMPLERS[sampler])
    sync, asyn = _k_zero_is_sync(tmp_path, tiny_model_dir, tiny_dataset, **kw)
    keys = ("dynamic_sampling_rounds", "dynamic_sampling_dropped_share", "trained_groups", "accuracy")
    sync_lines, async_lines = _lines(sync.run_dir), _lines(asyn.run_dir)
    assert [[l.get(k) for k in keys] for l in sync_lines] == [[l.get(k) for k in keys] for l in async_lines]
    if "dynamic_sampling" in SAMPLERS[sampler]:  # the rounds did something: a group was left out somewhere
        assert any(l["dynamic_sampling_dropped_share"] > 0 for l in sync_lines)
    if "difficulty_sampling" in SAMPLERS[sampler]:  # the pass rates moved the draws off the plain stream
        plain = Recording(make_cfg(tmp_path / "plain", tiny_model_dir, tiny_dataset,
                                   **{**kw, "difficulty_sampling": False}))
        plain.train()
        assert any(not torch.equal(a, b) for a, b in zip(_prompts_per_step(plain), _prompts_per_step(sync)))


def test_the_difficulty_sampler_resumes_with_the_pass_rates_it_had_not_heard_yet(tmp_path, tiny_model_dir,
                                                                                 tiny_dataset):
    """K = 0 with the difficulty sampler, stopped after 2 steps and resumed for 2 more: the checkpoint
    holds the draws the sampler had not heard of and their pass rates, so the resumed run draws the
    uninterrupted (synchronous) run's prompts at every step."""
    kw = dict(rollout_engine="hf", eval_prompts=0, async_engine_threads=1, difficulty_sampling=True,
              difficulty_memory=2)
    sync = Recording(make_cfg(tmp_path / "sync", tiny_model_dir, tiny_dataset, max_steps=4, **kw))
    sync.train()
    first = Recording(make_cfg(tmp_path / "async", tiny_model_dir, tiny_dataset, max_steps=2, async_rollouts=True,
                               max_staleness=0, **kw))
    first.train()
    again = Recording(make_cfg(tmp_path / "async", tiny_model_dir, tiny_dataset, max_steps=4, async_rollouts=True,
                               max_staleness=0, resume_from_checkpoint="auto", **kw))
    again.train()
    stream = _prompts_per_step(first) + _prompts_per_step(again)
    assert len(stream) == 4
    for s, (a, b) in enumerate(zip(_prompts_per_step(sync), stream)):
        assert torch.equal(a, b), f"step {s} trained other prompts than the uninterrupted run's"


def test_at_k_one_each_draw_hears_the_pass_rates_of_the_draw_two_before_it(tmp_path, tiny_model_dir, tiny_dataset,
                                                                         monkeypatch):
    """K = 1 with the difficulty sampler and a reward that waits: just before draw d the prompt sampler
    hears of draw d - 2's pass rates (the lag K + 1, whenever they were scored), in order, each once, and
    they are the pass rates the scorer computed for that draw."""
    from grpo.train.collect import Collector

    scored = []
    real_score = Collector.score

    def score(self, *args, **kw):
        out = real_score(self, *args, **kw)
        scored.append(list(self.last_pass_rates))
        return out

    monkeypatch.setattr(Collector, "score", score)
    t = Trainer(make_cfg(tmp_path, tiny_model_dir, tiny_dataset, max_steps=4, async_rollouts=True, max_staleness=1,
                         rollout_engine="hf", eval_prompts=0, rewards="tests.async_rewards:slow_digit_share",
                         async_engine_threads=1, difficulty_sampling=True, difficulty_memory=2))
    sampler, events = t.collector.sampler, []
    real_draw, real_observe = sampler.draw, sampler.observe
    monkeypatch.setattr(sampler, "draw", lambda count: (events.append("draw"), real_draw(count))[1])
    monkeypatch.setattr(sampler, "observe", lambda rates: (events.append(list(rates)), real_observe(rates))[1])
    t.train()
    at = [i for i, e in enumerate(events) if e == "draw"]
    assert len(at) >= 5
    for d, i in enumerate(at):
        assert sum(e != "draw" for e in events[:i]) == max(0, d - 1), (d, events)
    heard = [e for e in events if e != "draw"]
    assert heard and heard == scored[:len(heard)]


def test_dynamic_sampling_at_k_one_trains_informative_groups_within_the_bound(tmp_path, tiny_model_dir,
                                                                             tiny_dataset, monkeypatch):
    """K = 1 with a trainer slower than the producer (its update waits 0.6 s) and no turns, so only the
    admission rule holds the producer back: each step trains one slot of groups whose rewards are not
    all equal (or, when no round gave one, its last draw as it is), drawn by weights at most one step
    old, so no group is over the bound; the figures are the synchronous step's."""
    import time

    from grpo.train.async_rollouts import AsyncRollouts

    trained = []
    real, real_update = AsyncRollouts.collect, Trainer.update

    def spy(self, **kw):
        got = real(self, **kw)
        trained.append(got.rewards.clone())  # [B', G]
        return got

    def slow_update(self, batch):
        time.sleep(0.6)
        return real_update(self, batch)

    monkeypatch.setattr(AsyncRollouts, "collect", spy)
    monkeypatch.setattr(Trainer, "update", slow_update)
    t = Trainer(make_cfg(tmp_path, tiny_model_dir, tiny_dataset, max_steps=5, async_rollouts=True, max_staleness=1,
                         rollout_engine="hf", eval_prompts=0, async_engine_threads=1, rollout_correction_level="token",
                         async_turns=False, **SAMPLERS["both"]))
    t.train()
    lines = _lines(t.run_dir)
    assert len(lines) == len(trained) == 5
    for line, rewards in zip(lines, trained):
        assert line["async/staleness_max"] <= 1 and line["async/staleness_over"] == 0
        assert line["async/dropped_groups"] == 0 and 1 <= line["dynamic_sampling_rounds"] <= 3
        if line["dynamic_sampling_empty"]:
            assert line["dynamic_sampling_rounds"] == 3
        else:
            assert (rewards.max(1).values > rewards.min(1).values).all()
            assert line["trained_groups"] == len(rewards)
    assert any(l["async/staleness_1"] > 0 for l in lines), "nothing drawn while a step trained"


def _turn_intervals(monkeypatch):
    """Record the producer's sampling calls and the trainer's turns (from the end of ``collect`` to the
    next publish) as (start, end) perf_counter intervals."""
    import threading
    import time

    from grpo.train.async_rollouts import AsyncRollouts
    from grpo.train.collect import Collector

    got = {"sampling": [], "trainer": []}
    real_sample, real_collect, real_new = Collector.sample, AsyncRollouts.collect, AsyncRollouts.new_weights

    def sample(self, **kw):
        t0 = time.perf_counter()
        try:
            return real_sample(self, **kw)
        finally:
            if threading.current_thread().name == "grpo-async-_produce":
                got["sampling"].append((t0, time.perf_counter()))

    def collect(self, **kw):
        out = real_collect(self, **kw)
        got["trainer"].append([time.perf_counter(), None])
        return out

    def new_weights(self, **kw):
        if got["trainer"] and got["trainer"][-1][1] is None:
            got["trainer"][-1][1] = time.perf_counter()
        return real_new(self, **kw)

    monkeypatch.setattr(Collector, "sample", sample)
    monkeypatch.setattr(AsyncRollouts, "collect", collect)
    monkeypatch.setattr(AsyncRollouts, "new_weights", new_weights)
    return got


@pytest.mark.parametrize("turns", [True, False])
def test_on_the_cpu_the_engine_samples_and_the_trainer_computes_in_turns(tmp_path, tiny_model_dir, tiny_dataset,
                                                                         monkeypatch, turns):
    """async_turns (the default on the CPU, one process): the engine process samples on every core
    while the trainer waits, and the trainer's step (from taking its groups to publishing its weights)
    never runs while the engine samples; with async_turns=false they overlap, the engine on half the
    cores. K = 1 with rewards that do not wait, so the next draw is admitted as each step starts."""
    got = _turn_intervals(monkeypatch)
    threads = torch.get_num_threads()
    try:  # two trainer threads (num_threads), so the engine's share differs with turns and without
        t = Trainer(make_cfg(tmp_path, tiny_model_dir, tiny_dataset, max_steps=6, async_rollouts=True,
                             max_staleness=1, rollout_engine="hf", eval_prompts=0, async_turns=turns, num_threads=2))
        assert t.engines.process.threads == (2 if turns else 1)
        t.train()
    finally:
        torch.set_num_threads(threads)
    trainer = [(a, b) for a, b in got["trainer"] if b is not None]
    assert len(got["sampling"]) >= 6 and len(trainer) >= 5
    overlaps = [(s, c) for s in got["sampling"] for c in trainer if s[0] < c[1] and c[0] < s[1]]
    if turns:
        assert not overlaps, overlaps
    else:
        assert overlaps, "the engine never sampled while the trainer computed"


def test_partial_rollouts_reach_the_engine_process(tmp_path, tiny_model_dir, tiny_dataset):
    """partial_rollouts is wired through the trainer to the engine process: its segment length is
    partial_rollout_tokens with it, 0 (each call finishes under its weights) without."""
    for partial, want in ((True, 3), (False, 0)):
        t = Trainer(make_cfg(tmp_path / str(partial), tiny_model_dir, tiny_dataset, eval_prompts=0, max_steps=1,
                             async_rollouts=True, partial_rollouts=partial, partial_rollout_tokens=3,
                             rollout_engine="hf", async_engine_threads=1))
        try:
            assert t.engines.process.segment_tokens == want
        finally:
            t.close()
