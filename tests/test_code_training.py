"""Code-training helpers in the loop: resampling completions a reward cannot grade (seed 003 section 5.1:
unparsable programs), and the token weight gamma on the advantage."""

from __future__ import annotations

import dataclasses
import json

import torch

from grpo.infra.distributed import World
from grpo.rewards import REWARDS, Reward
from grpo.rewards.code import program_parses
from grpo.rollout import Rollout
from grpo.train.resample import resample_invalid, validity_checks
from tests.conftest import needs_bwrap


def rollout(texts: list[str], width: int) -> Rollout:
    n = len(texts)
    ids = torch.arange(n * width).view(n, width)  # [n, T] distinct tokens per row
    return Rollout(torch.ones(n, 2, dtype=torch.long), torch.ones(n, 2, dtype=torch.long), ids,
                   torch.ones(n, width, dtype=torch.long), torch.zeros(n, dtype=torch.bool), None, texts, "test", 1.0)


def test_invalid_rows_are_replaced_in_place_and_rounds_are_bounded():
    calls = []

    def generate(prompts, keys):  # a key that is a multiple of 3 writes a program that parses
        calls.append(list(keys))
        return rollout(["x = 1" if k % 3 == 0 else "def (" for k in keys], 3)

    first = rollout(["x = 1", "def (", "y = 2", "if :"], 2)
    prompts = ["p0", "p1", "p2", "p3"]
    got = resample_invalid(first, [{}] * 4, prompts, checks=[program_parses], rounds=3, generate=generate,
                           key_of=lambda rnd, row: 10 * rnd + row + 1, pad_id=-1, world=World())
    # round 0: rows 1, 3 get keys 2, 4 (neither parses); round 1: keys 12 (parses), 14; round 2: key 24 (parses)
    assert calls == [[2, 4], [12, 14], [24]]
    assert (got.rounds, got.resampled, got.invalid_left) == (3, 5, 0)
    assert got.rollout.texts == ["x = 1", "x = 1", "y = 2", "x = 1"]
    assert got.rollout.completion_ids[0, :2].tolist() == [0, 1]  # a valid row keeps its tokens
    assert got.rollout.completion_ids[0, 2] == -1 and got.rollout.completion_mask[0, 2] == 0  # padded
    assert got.rollout.seconds == 4.0  # the first draw and three resampling rounds

    never = resample_invalid(first, [{}] * 4, prompts, checks=[program_parses], rounds=2,
                             generate=lambda p, k: rollout(["def ("] * len(k), 1), key_of=lambda r, i: 1,
                             pad_id=0, world=World())
    assert (never.rounds, never.resampled, never.invalid_left) == (2, 4, 2)  # the bound holds
    assert validity_checks({"numeric": REWARDS["numeric"]}) == []  # a reward without a check resamples nothing
    assert validity_checks({"numeric": REWARDS["numeric"], "code": REWARDS["code"]}) == [program_parses]


def test_a_check_is_declared_on_the_reward_never_read_off_a_function():
    """A user's reward declares a validity check by being a Reward; a function attribute is not read."""
    def mine(completion, sample):
        return 1.0

    mine.valid = program_parses
    assert validity_checks({"mine": Reward.of("mine", mine)}) == []
    assert validity_checks({"mine": Reward("mine", mine, valid=program_parses)}) == [program_parses]


@needs_bwrap
def test_the_trainer_resamples_unparsable_programs(tmp_path, tiny_model_dir):
    from grpo.train.trainer import Trainer
    from tests.test_trainer import make_cfg

    cfg = make_cfg(tmp_path, tiny_model_dir, "code", task="code", rewards="code", max_steps=1, eval_prompts=0,
                   max_completion_length=8, resample_invalid_rounds=2)
    t = Trainer(cfg)
    scored, original = [], t.collector.score
    t.collector.score = lambda samples, ro, **kw: (scored.append(list(ro.texts)), original(samples, ro, **kw))[1]
    t.train()
    line = json.loads((t.run_dir / "metrics.jsonl").read_text().splitlines()[0])

    left = sum(not program_parses(x, {}) for x in scored[0])
    assert line["invalid_after_resampling"] == left and line["grading_seconds"] > 0
    assert 0 <= line["resample_rounds"] <= 2 and line["resampled_completions"] >= left
    if left:  # rows still invalid: every allowed round was spent on them
        assert line["resample_rounds"] == 2


def test_token_weight_gamma_multiplies_the_advantage_of_code_tokens(tmp_path, tiny_model_dir):
    from grpo.train.code_tokens import code_token_vocab
    from grpo.train.trainer import Trainer
    from tests.test_trainer import make_cfg, signal_seed

    seed = signal_seed(tmp_path, tiny_model_dir, "arithmetic")
    t = Trainer(make_cfg(tmp_path / "run", tiny_model_dir, "arithmetic", token_weight_gamma=2.0, beta=0.0, seed=seed))
    samples, ro = t.collector.sample(step=t.step, temperature=t.knobs.temperature)
    rewards, _ = t.collector.score(samples, ro, step=t.step)
    weighted, metrics = t.batches.make(ro, rewards, samples, temperature=1.0, beta=0.0)
    t.batches.settings = dataclasses.replace(t.batches.settings, token_weight_gamma=1.0)
    plain, _ = t.batches.make(ro, rewards, samples, temperature=1.0, beta=0.0)
    marked = code_token_vocab(t.tok, len(t.tok))[ro.completion_ids]  # [N, T]
    assert marked.any() and (~marked).any()
    assert torch.equal(weighted.advantages, torch.where(marked, 2.0 * plain.advantages, plain.advantages))
    assert 0 < metrics["weighted_token_share"] < 1


def test_the_code_hard_task_references_pass_their_tests():
    from grpo.data import load_task

    t = load_task("code_hard", eval_size=15)
    assert (len(t.train), len(t.eval)) == (81, 15)
    assert not {s["prompt"] for s in t.train} & {s["prompt"] for s in t.eval}
    for s in t.train + t.eval:
        ns: dict = {}
        exec(s["answer"], ns)  # the task's own references: trusted
        for test in s["tests"]:
            exec(test, dict(ns))
        assert program_parses(f"```python\n{s['answer']}```", s)
    # the empty inputs are among the tests, and every problem's expected values are not all equal
    assert sum("f([])" in x or "f('')" in x for s in t.eval for x in s["tests"]) >= 5
