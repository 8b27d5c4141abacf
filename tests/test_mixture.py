"""Mixture specs, the keyed prompt stream of a mixture, the difficulty sampler's weights and draws,
per-source scoring and metrics, the verdict rule, and the best-checkpoint choice (no model)."""

from __future__ import annotations

import math

import pytest
import torch

from grpo.config import Config
from grpo.config.io import load_config
from grpo.config.mixture_settings import eval_task_specs, source_specs
from grpo.data import PromptSampler
from grpo.data.difficulty import DifficultySampler, difficulty_weight
from grpo.data.mixture import MixtureSampler, Source, keyed_uniform, parse_mixture
from grpo.errors import ConfigError, DataError
from grpo.rewards.reward import RewardOptions
from grpo.rewards.runner import RewardRunner
from grpo.rewards.verdict import first_applicable
from grpo.train.best import BestCheckpoint
from grpo.train.source_rewards import SourceRewards, source_metrics


# ---- the spec ------------------------------------------------------------------------------------
def test_parse_mixture_forms():
    assert parse_mixture("arithmetic") is None and parse_mixture("data/my.jsonl") is None
    got = parse_mixture("arithmetic:0.5,calculator:0.3,my.jsonl:0.2")
    assert [(s.name, s.weight, s.label) for s in got] == [("arithmetic", 0.5, "arithmetic"),
                                                          ("calculator", 0.3, "calculator"), ("my.jsonl", 0.2, "my")]
    yaml_list = parse_mixture([{"task": "arithmetic", "weight": 2, "rewards": "numeric"}, "calculator:1"])
    assert yaml_list[0] == Source("arithmetic", 2.0, {"rewards": "numeric"}) and yaml_list[1].weight == 1.0
    assert parse_mixture('[{"task": "a.jsonl", "label": "mine"}, "b.jsonl"]')[0].label == "mine"
    assert parse_mixture("arithmetic:1") == [Source("arithmetic", 1.0)]  # a mixture of one
    assert Config(task=[{"task": "arithmetic", "weight": 2}, "calculator:1"]).task.startswith("[")


@pytest.mark.parametrize("spec, message", [
    ("arithmetic:0,calculator:1", "weight '0' must be a positive number"),
    ("arithmetic:nan,calculator:1", "must be a positive number"),
    ([{"task": "arithmetic", "lr": 1}, "calculator"], r"unknown setting\(s\) \['lr'\]"),
    ("a/x.jsonl,b/x.jsonl", r"label\(s\) \['x'\] repeated"),
    ([{"weight": 1}, "calculator"], "a mapping needs 'task'"),
])
def test_parse_mixture_errors(spec, message):
    with pytest.raises(DataError, match=message):
        parse_mixture(spec)


def test_mixture_presets_shared_and_refusals():
    c = Config(task="arithmetic:0.5,calculator:0.5")
    assert c.max_completion_length == 64 and c.tools == ""  # the batch's budget fits the calculator's episodes
    assert Config(task="arithmetic:0.5,calculator:0.5", max_completion_length=40).max_completion_length == 40
    with pytest.raises(ConfigError, match="^multi_objective_aggregation"):
        Config(task="arithmetic:0.5,calculator:0.5", multi_objective_aggregation="normalize_then_sum")
    with pytest.raises(ConfigError, match="^best_checkpoint_metric: needs eval_steps"):
        Config(best_checkpoint_metric="eval/accuracy")
    with pytest.raises(ConfigError, match="^best_checkpoint_metric: 'accuracy' is not an evaluation metric"):
        Config(best_checkpoint_metric="accuracy", eval_steps=2)


def test_a_source_is_scored_with_its_own_rewards_else_the_runs_else_its_tasks(tmp_path):
    c = Config(task="arithmetic:0.5,code:0.5")
    assert c.rewards == ""  # unset: each source's own, so a saved config resolves the same way again
    specs = {s.label: s for s in source_specs(c)}
    assert (specs["arithmetic"].rewards, specs["code"].rewards) == ("numeric,stated_answer", "code")  # each task's own
    c.save(tmp_path / "config.yaml")
    assert source_specs(load_config(tmp_path / "config.yaml")) == source_specs(c)
    given = Config(task=[{"task": "code", "rewards": "numeric,length", "reward_weights": [1, 2]}, "calculator:1"],
                   rewards="length", reward_weights=[3.0])
    specs = {s.label: s for s in source_specs(given)}
    assert (specs["code"].rewards, specs["code"].reward_weights) == ("numeric,length", (1.0, 2.0))  # its own
    assert (specs["calculator"].rewards, specs["calculator"].reward_weights) == ("length", (3.0,))  # the run's
    assert (specs["calculator"].tools, specs["calculator"].eval_prompts) == ("builtin:calculator", 100)  # preset
    assert specs["code"].tools == ""
    # eval_tasks are judged by their own task's rewards, not the run's (those of its own task)
    assert [s.rewards for s in eval_task_specs(Config(task="arithmetic", eval_tasks="code"))] == ["code"]
    weighted = {s.label: s for s in source_specs(Config(task=[{"task": "arithmetic", "reward_weights": [1, 0.5]},
                                                                "code:1"]))}
    assert weighted["arithmetic"].reward_weights == (1.0, 0.5)  # its weights, on its task's rewards
    with pytest.raises(ConfigError, match="source 'code': 1 reward_weights for 2 rewards"):
        source_specs(Config(task=[{"task": "code", "rewards": "numeric,length", "reward_weights": [1]}, "arithmetic"]))


# ---- the keyed stream ------------------------------------------------------------------------------
def _mixture(weights, sizes=(50, 30, 20), seed=3):
    return MixtureSampler(list(sizes), list(weights), [PromptSampler(n, seed=seed * 10 + i) for i, n in enumerate(sizes)],
                          seed=seed)


def _source(m, index):
    return max(i for i, off in enumerate(m.offsets) if index >= off)


def test_sources_are_drawn_by_weight():
    """Each source's share of 20,000 draws is within 4.5 binomial standard deviations of its weight."""
    weights, n = [0.5, 0.3, 0.2], 20_000
    m = _mixture(weights)
    picks = [_source(m, i) for i in m.draw(n)]
    for s, w in enumerate(weights):
        share = picks.count(s) / n
        assert abs(share - w) < 4.5 * math.sqrt(w * (1 - w) / n), (s, share, w)
    # consecutive prompts are independent: P(same source twice) = sum w^2
    same = sum(a == b for a, b in zip(picks, picks[1:])) / (n - 1)
    p = sum(w * w for w in weights)
    assert abs(same - p) < 4.5 * math.sqrt(p * (1 - p) / n)


def test_stream_depends_on_position_only_and_resumes_exactly():
    """Drawn in steps of any size, the stream is the same; a sampler restored from a state continues it."""
    one = _mixture([1, 1, 2]).draw(300)
    chunked, m = [], _mixture([1, 1, 2])
    for size in (1, 7, 13, 29, 50, 200):
        chunked += m.draw(size)
    assert chunked == one
    m = _mixture([1, 1, 2])
    m.draw(117)
    restored = _mixture([1, 1, 2])
    restored.load_state_dict(m.state_dict())
    assert restored.draw(183) == one[117:] == m.draw(183)
    with pytest.raises(DataError, match="sources of"):
        _mixture([1, 1], sizes=(5, 6)).load_state_dict(m.state_dict())


def test_keyed_uniform_is_uniform():
    us = [keyed_uniform(7, k) for k in range(20_000)]
    assert 0 < min(us) and max(us) < 1
    assert abs(sum(us) / len(us) - 0.5) < 4.5 * math.sqrt(1 / 12 / len(us))


# ---- the difficulty sampler ------------------------------------------------------------------------
def test_difficulty_weights_by_hand():
    assert difficulty_weight([], floor=0.1) == 1.0  # unseen: as p = 1/2
    assert difficulty_weight([1.0, 1.0], floor=0.1) == pytest.approx(0.1)  # always solved
    assert difficulty_weight([0.0], floor=0.1) == pytest.approx(0.1)  # never solved
    assert difficulty_weight([0.25, 0.75], floor=0.1) == pytest.approx(1.0)  # p = 1/2
    assert difficulty_weight([0.25], floor=0.2) == pytest.approx(0.2 + 0.8 * 0.75)
    s = DifficultySampler(4, seed=0, memory=2, floor=0.1)
    s.update([0, 0, 0], [0.0, 1.0, 1.0])  # only the last 2 kept: p = 1
    s.update([1], [float("nan")])  # an unscorable group says nothing
    assert s.history == {0: [1.0, 1.0]} and s.weight(0) == pytest.approx(0.1) and s.weight(1) == 1.0


def test_difficulty_draws_follow_weights_and_resume():
    """Weighted draws of one prompt out of two (weights 1 and 0.1) pick the heavy one 1/1.1 of the time;
    a draw of several holds no repeats; a restored sampler continues the same draws."""
    s = DifficultySampler(2, seed=5, memory=1, floor=0.1)
    s.update([1], [1.0])  # prompt 1: always solved -> weight 0.1
    n = 6_000
    heavy = sum(s.draw(1) == [0] for _ in range(n)) / n
    p = 1 / 1.1
    assert abs(heavy - p) < 4.5 * math.sqrt(p * (1 - p) / n), heavy
    s = DifficultySampler(10, seed=1)
    first = s.draw(8)
    assert len(set(first)) == 8 and len(s.draw(25)) == 25
    s.observe([1.0] * 8)  # the first draw's outcomes, oldest first
    assert all(s.history[i] == [1.0] for i in first)
    restored = DifficultySampler(10, seed=1)
    restored.load_state_dict(s.state_dict())
    assert restored.draw(9) == s.draw(9)


def test_difficulty_sampler_inside_a_mixture_hears_its_own_prompts():
    inner = [DifficultySampler(4, seed=0), DifficultySampler(3, seed=1)]
    m = MixtureSampler([4, 3], [1, 1], inner, seed=2)
    drawn = m.draw(6)
    m.observe([0.25 * (i + 1) for i in range(6)])
    seen = {(_source(m, g), g - m.offsets[_source(m, g)]): 0.25 * (j + 1) for j, g in enumerate(drawn)}
    for (s, i), rate in seen.items():
        assert inner[s].history[i] == [rate]


# ---- scoring by source, verdicts, metrics -----------------------------------------------------------
def test_source_rewards_score_each_row_with_its_own_rewards():
    here = RewardOptions(timeout=0.0, retries=0)  # in this process
    runners = {"a": RewardRunner(["tests.rewards_for_tests:digit_share"], None, here),
               "b": RewardRunner(["length", "tests.rewards_for_tests:digit_share"], [2.0, 1.0], here)}
    rewards = SourceRewards(runners)
    texts, samples = ["12", "1x", "abc", "12"], [{"task": t, "answer": "1"} for t in "abba"]
    got = rewards.score(texts, samples)
    a = runners["a"].score([texts[0], texts[3]], [samples[0], samples[3]])
    b = runners["b"].score(texts[1:3], samples[1:3])
    assert torch.equal(got.total, torch.stack([a.total[0], b.total[0], b.total[1], a.total[1]]).double())
    assert math.isnan(got.per_reward["length"][0]) and not math.isnan(got.per_reward["length"][1])
    verdict = rewards.verdict_values(samples, got.per_reward)
    assert torch.equal(verdict, got.per_reward["tests.rewards_for_tests:digit_share"].where(
        torch.tensor([True, False, False, True]), got.per_reward["length"]))
    with pytest.raises(DataError, match="'c', not a source"):
        rewards.score(["1"], [{"task": "c"}])


def test_first_applicable_and_source_metrics():
    nan = float("nan")
    per = {"x": torch.tensor([1.0, nan, nan, 0.0]), "y": torch.tensor([0.0, 1.0, nan, 1.0])}
    assert torch.equal(first_applicable(per, ["x", "y"]).isnan(), torch.tensor([False, False, True, False]))
    assert first_applicable(per, ["x", "y"])[:2].tolist() == [1.0, 1.0] and first_applicable(per, ["y", "x"])[0] == 0.0
    m = source_metrics(["a", "a", "b", "a"], torch.tensor([1.0, 0.0, nan, 0.5]), torch.tensor([True, False, False, True]),
                       ["a", "b", "c"])
    assert m == {"share/a": 0.75, "reward/a": 0.5, "accuracy/a": pytest.approx(2 / 3), "share/b": 0.25,
                 "accuracy/b": 0.0, "share/c": 0.0}


# ---- the best checkpoint ----------------------------------------------------------------------------
def test_best_checkpoint_keeps_the_best_evaluation():
    best = BestCheckpoint("eval/a/accuracy")
    seen = [best.offer(step, m) for step, m in [(1, {"loss": 1.0}), (2, {"eval/a/accuracy": 0.2}),
                                               (3, {"eval/a/accuracy": 0.5}), (4, {"eval/a/accuracy": 0.5}),
                                               (5, {"eval/a/accuracy": 0.3}), (6, {"eval/interrupted": 1}),
                                               (7, {"eval/a/accuracy": float("nan")})]]
    assert seen == [False, True, True, False, False, False, False] and (best.step, best.value) == (3, 0.5)
    low = BestCheckpoint("eval/mean_length", mode="min")
    assert [low.offer(s, {"eval/mean_length": v}) for s, v in [(1, 9.0), (2, 7.0), (3, 8.0)]] == [True, True, False]
    restored = BestCheckpoint("eval/a/accuracy")
    restored.load_state_dict(best.state_dict())
    assert not restored.offer(8, {"eval/a/accuracy": 0.4}) and restored.offer(9, {"eval/a/accuracy": 0.6})
    with pytest.raises(ConfigError, match=r"'eval/a/accuracy' is not a metric of the evaluation; it logged \['eval/b'\]"):
        BestCheckpoint("eval/a/accuracy").offer(1, {"eval/b": 1.0})
