"""Mixtures end to end on a tiny Llama: two sources trained with per-source metrics and an exact
resume, a TRL-form two-task script (rewards returning None on the other task's rows, two environment
classes in a dict) run unchanged, evaluation suites, and the best checkpoint."""

from __future__ import annotations

import json

import pytest
import torch

from grpo.api import GRPOConfig, GRPOTrainer
from grpo.train.trainer import Trainer
from tests import mixture_envs_for_tests as envs
from tests.test_checkpoint import metric_lines, weights_hash
from tests.test_trainer import make_cfg

MIX = "arithmetic:0.5,calculator:0.5"


def _mix_cfg(tmp_path, name, model_dir, **kw):
    kw = {"task": MIX, "eval_prompts": 0, "max_steps": 4, "num_iterations": 2, "beta": 0.05,
          "max_completion_length": 8, "eval_max_new_tokens": 6, **kw}
    return make_cfg(tmp_path / name, model_dir, None, **kw)


@pytest.mark.parametrize("extra", [{}, {"difficulty_sampling": True, "difficulty_memory": 2}],
                         ids=["uniform", "difficulty"])
def test_a_mixture_trains_both_sources_and_resumes_exactly(tmp_path, tiny_model_dir, extra):
    full = Trainer(_mix_cfg(tmp_path, "full", tiny_model_dir, **extra))
    assert set(full.sources.routes) == {"arithmetic", "calculator"} and full.agent is not None
    assert full.agent.routes["calculator"][0] and not full.agent.routes["arithmetic"][0]  # the calculator's tool only
    full.train()
    part = Trainer(_mix_cfg(tmp_path, "part", tiny_model_dir, max_steps=2, **extra))
    part.train()
    resumed = Trainer(_mix_cfg(tmp_path, "part", tiny_model_dir, resume_from_checkpoint=str(part.run_dir), **extra))
    assert resumed.step == 2
    resumed.train()
    assert weights_hash(resumed.policy) == weights_hash(full.policy)
    lines = metric_lines(full.run_dir)
    assert metric_lines(resumed.run_dir) == lines
    for line in lines:
        assert line["share/arithmetic"] + line["share/calculator"] == pytest.approx(1.0)
        for label in ("arithmetic", "calculator"):
            assert (f"reward/{label}" in line) == (line[f"share/{label}"] > 0), line
    assert all(sum(line[f"share/{label}"] for line in lines) > 0 for label in ("arithmetic", "calculator"))
    samples = [json.loads(x) for x in (full.run_dir / "samples.jsonl").read_text().splitlines()]
    assert {s["task"] for s in samples} == {"arithmetic", "calculator"}
    if extra:  # the difficulty sampler's history is checkpointed, and it heard each scored group
        state = torch.load(part.run_dir / "checkpoints" / "step-2" / "trainer_state.pt", weights_only=False)
        inner = state["collector"]["sampler"]["sources"]
        assert sum(len(h) for s in inner for h in s["history"].values()) == 2 * 2  # 2 steps x 2 prompts


def test_a_trl_form_two_task_script_runs_unchanged(tmp_path, tiny_model_dir):
    args = GRPOConfig(output_dir=str(tmp_path / "run"), max_steps=3, num_generations=4, per_device_train_batch_size=4,
                      max_completion_length=8, eval_prompts=6, eval_max_new_tokens=6, eval_pass_k=0, learning_rate=1e-2,
                      temperature=1.0, progress=False, report_to="none", reward_timeout=0.0, seed=3,
                      prompts_per_step=4, log_completions_steps=1, eval_steps=3,
                      best_checkpoint_metric="eval/calculator/accuracy")
    trainer = GRPOTrainer(model=str(tiny_model_dir), reward_funcs=[envs.arithmetic_reward, envs.calculator_reward],
                          args=args, train_dataset=envs.rows(),
                          environment_factory={"arithmetic": envs.AdderEnv, "calculator": envs.MultiplierEnv})
    assert trainer.args.environment_factory == ("arithmetic=tests.mixture_envs_for_tests:AdderEnv,"
                                                "calculator=tests.mixture_envs_for_tests:MultiplierEnv")
    result = trainer.train()
    lines = [json.loads(x) for x in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3]
    for line in lines:  # each row ran in its own environment (a wrong one raises: a counted failure)
        assert line["reward_failures"] == 0, line
        assert line["share/arithmetic"] + line["share/calculator"] == 1.0
    assert {"eval/arithmetic/accuracy", "eval/calculator/accuracy"} <= set(lines[-1])
    for when in ("before", "after"):
        suites = result[when]["suites"]
        assert set(suites) == {"arithmetic", "calculator"}
        assert sum(s["n_prompts"] for s in suites.values()) == result[when]["n_prompts"] == 6
    assert json.loads((trainer.run_dir / "best" / "best.json").read_text())["step"] == 3


def test_eval_tasks_are_suites_and_the_best_checkpoint_is_the_best_evaluation(tmp_path, tiny_model_dir, tiny_dataset):
    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, max_steps=4, eval_steps=1, save_steps=1, eval_pass_k=0,
                   eval_tasks="arithmetic", eval_prompts=3, best_checkpoint_metric="eval/sums/mean_length",
                   best_checkpoint_mode="min", max_completion_length=8, eval_max_new_tokens=8, learning_rate=5e-2)
    t = Trainer(cfg)
    assert [s.label for s in t.sources.suites] == ["sums", "arithmetic"] and t.agent is None
    result = t.train()
    lines = [json.loads(x) for x in (t.run_dir / "metrics.jsonl").read_text().splitlines()]
    values = [(line["eval/sums/mean_length"], line["step"]) for line in lines]
    best_value = min(v for v, _ in values)
    best_step = next(s for v, s in values if v == best_value)  # the first evaluation reaching the minimum
    kept = json.loads((t.run_dir / "best" / "best.json").read_text())
    assert (kept["step"], kept["value"]) == (best_step, best_value)
    assert all("eval/arithmetic/accuracy" in line for line in lines)
    assert result["after"]["suites"]["arithmetic"]["n_prompts"] == 3
    from safetensors.torch import load_file
    best = load_file(t.run_dir / "best" / "model.safetensors")
    at_step = load_file(t.run_dir / "checkpoints" / f"step-{best_step}" / "model.safetensors")
    assert best.keys() == at_step.keys() and all(torch.equal(best[k], at_step[k]) for k in best)


def test_the_difficulty_sampler_hears_each_prompts_own_pass_rate(tmp_path, tiny_model_dir, tiny_dataset):
    """The pass rates the trainer gives the sampler are the groups' own: with a reward that passes every
    row whose answer is odd, each drawn prompt's history is all 1.0 or all 0.0 by its answer, and both
    occur (a sampler fed zeros, or anything not the group's rate, fails here)."""
    t = Trainer(make_cfg(tmp_path, tiny_model_dir, tiny_dataset, eval_prompts=0, max_steps=3, difficulty_sampling=True,
                         rewards="tests.rewards_for_tests:answer_is_odd"))
    t.train()
    history = t.collector.sampler.history
    assert history, "no pass rate was observed"
    expected = {i: float(int(t.task.train[i]["answer"]) % 2) for i in history}
    assert {i: set(rates) for i, rates in history.items()} == {i: {expected[i]} for i in history}
    assert set(expected.values()) == {0.0, 1.0}
    t.close()
