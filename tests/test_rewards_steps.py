"""grpo.rewards.steps: rule-based step rewards, text-to-token step mapping, process supervision."""

from __future__ import annotations

import json

import pytest
import torch

from grpo.rewards.steps import (STEP_REWARDS, arithmetic_steps, char_ends_to_tokens, resolve_step_reward,
                                step_tensors)
from grpo.train.trainer import Trainer
from tests.conftest import build_tokenizer
from tests.test_trainer import make_cfg


def test_arithmetic_steps_by_hand():
    text = "3 + 4 = 7\n7 * 2 = 15\nSo the answer is 14"
    # line 1 "3 + 4 = 7" (chars 0..9) right; line 2 "7 * 2 = 15" (10..20) wrong; the answer line (21..40)
    # has no equation and states 14 = gold: a final step scoring the outcome
    assert arithmetic_steps(text, {"answer": "14"}) == [(1.0, 9), (0.0, 20), (1.0, 40)]
    assert arithmetic_steps(text, {"answer": "15"}) == [(1.0, 9), (0.0, 20), (0.0, 40)]
    # the last line is an equation and the answer: its step needs both to be right
    assert arithmetic_steps("12 + 30 = 42", {"answer": "42"}) == [(1.0, 12)]
    assert arithmetic_steps("12 + 30 = 43", {"answer": "43"}) == [(0.0, 12)]
    assert arithmetic_steps("5 / 0 = 1\n", {"answer": "1"}) == [(0.0, 9)]  # the final step ends at 9 too
    assert arithmetic_steps("", {"answer": "1"}) == [(0.0, 0)]


def test_unknown_step_reward_lists_the_builtins():
    with pytest.raises(ValueError, match="arithmetic_steps"):
        resolve_step_reward("nope")
    assert resolve_step_reward("arithmetic_steps") is STEP_REWARDS["arithmetic_steps"]


def test_char_offsets_map_to_the_token_that_completes_them():
    tok = build_tokenizer()  # byte-level: one token per byte
    ids = tok("ab\ncd", add_special_tokens=False)["input_ids"]
    assert len(ids) == 5
    assert char_ends_to_tokens(tok, ids, [2, 5, 99]) == [1, 4, 4]  # 'ab' ends at token 1; past the end -> last
    ids = tok("é=1", add_special_tokens=False)["input_ids"]  # 'é' is two bytes, two tokens
    assert len(ids) == 4
    assert char_ends_to_tokens(tok, ids, [1, 3]) == [1, 3]  # 'é' is complete only after its second byte


def test_step_tensors_and_failures():
    tok = build_tokenizer()
    texts = ["1 + 1 = 2\n2", "1 + 1 = 3\n2", "x"]
    enc = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    t_max = max(map(len, enc))
    ids = torch.tensor([e + [tok.pad_token_id] * (t_max - len(e)) for e in enc])  # [3, T]
    mask = torch.tensor([[1] * len(e) + [0] * (t_max - len(e)) for e in enc])  # [3, T]

    def fn(text, sample):
        if text == "x":
            raise RuntimeError("boom")
        return arithmetic_steps(text, sample)

    rewards, ends, problems = step_tensors(fn, tok, ids, mask, texts, [{"answer": "2"}] * 3)
    # steps: equation line ending at char 9 -> token 8, answer '2' ending at char 11 -> token 10
    assert rewards.tolist() == [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]]
    assert ends.tolist() == [[8, 10], [8, 10], [-1, -1]]
    assert problems == ["step reward failed on completion 2 (RuntimeError: boom)"]
    # faults.md row 46, through what the trainer calls: the completion whose step reward raised leaves
    # the loss (its mask row is all 0, so it has no advantage either), the others keep theirs, and the
    # failure is counted in step_reward_failures. One group of 4: the failing one and three that score.
    from types import SimpleNamespace

    from grpo.rewards.steps import process_supervision

    texts4 = texts[:2] + ["1 + 1 = 2\n2", "x"]
    enc4 = enc[:2] + [enc[0], enc[2]]
    ids4 = torch.tensor([e + [tok.pad_token_id] * (t_max - len(e)) for e in enc4])  # [4, T]
    mask4 = torch.tensor([[1] * len(e) + [0] * (t_max - len(e)) for e in enc4])  # [4, T]
    ro = SimpleNamespace(completion_ids=ids4, completion_mask=mask4, texts=texts4)  # the rollout fields it reads
    adv, kept, metrics = process_supervision(fn, tok, ro, [{"answer": "2"}], mask4, group_size=4, std_eps=1e-4,
                                             unbiased_std=False)
    assert metrics["step_reward_failures"] == 1
    assert kept[3].sum() == 0 and (adv[3] == 0).all()
    assert torch.equal(kept[:3], mask4[:3]) and (adv[1][mask4[1].bool()] != 0).any()


def test_training_with_process_supervision_on_arithmetic(tmp_path, tiny_model_dir):
    cfg = make_cfg(tmp_path, tiny_model_dir, "arithmetic", task="arithmetic", rewards="numeric", supervision="process",
                   step_reward="arithmetic_steps", max_steps=3, eval_prompts=0, max_completion_length=12)
    t = Trainer(cfg)

    original = t.collector.sample

    def sample(**kw):  # the random model writes no arithmetic; half of each group gets a worked line
        samples, ro = original(**kw)
        for i in range(0, len(ro.texts), 2):
            ro.texts[i] = ro.texts[i] + ("\n1 + 1 = 2\ndone" if i % 4 == 0 else "\n1 + 1 = 3\ndone")
        return samples, ro

    t.collector.sample = sample
    before = {k: v.detach().clone() for k, v in t.policy.named_parameters()}
    t.train()
    assert any(not torch.equal(before[k], v) for k, v in t.policy.named_parameters())
    lines = [json.loads(l) for l in (t.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines] == [1, 2, 3]
    for line in lines:
        assert line["steps_per_completion"] >= 1 and line["step_reward_failures"] == 0
        # a right worked line (1.0) in a quarter of the completions, wrong ones and answers (0.0) elsewhere
        assert 0.0 < line["step_reward_mean"] < 1.0 and line["loss"] == line["loss"]


def test_process_supervision_token_advantages_by_hand():
    from types import SimpleNamespace

    from grpo.rewards.steps import process_supervision

    tok = build_tokenizer()
    texts = ["abcd", "wxyz"]  # one byte-level token per character
    ids = torch.tensor([tok(t, add_special_tokens=False)["input_ids"] for t in texts])  # [2, 4]
    mask = torch.ones(2, 4)
    steps = {"abcd": [(1.0, 2), (0.0, 4)], "wxyz": [(0.0, 4)]}  # char ends 2 and 4 -> tokens 1 and 3
    ro = SimpleNamespace(completion_ids=ids, completion_mask=mask.long(), texts=texts)
    adv, new_mask, metrics = process_supervision(lambda t, s: steps[t], tok, ro, [{"answer": ""}], mask,
                                                 group_size=2, std_eps=0.0, unbiased_std=True)
    # group step rewards [1, 0, 0]: mean 1/3; unbiased std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3) = 0.57735
    # normalized: 1.1547, -0.57735, -0.57735. Tokens 0-1 of "abcd" sum both of its steps: 0.57735; tokens 2-3
    # only the second: -0.57735; every token of "wxyz" its one step: -0.57735
    r = 3 ** -0.5
    assert torch.allclose(adv, torch.tensor([[r, r, -r, -r], [-r, -r, -r, -r]]), atol=1e-5)
    assert torch.equal(new_mask, mask) and metrics["steps_per_completion"] == 1.5


def test_the_last_step_reaches_the_eos_token():
    """The final step's end is the completion's last masked token (EOS), not the last text token, so
    the EOS token carries the last step's advantage (review: it got 0, and stopping went unreinforced)."""
    tok = build_tokenizer()
    text = "1 + 1 = 2"
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]  # 9 text tokens + EOS
    mask = torch.ones(1, len(ids), dtype=torch.long)
    rewards, ends, _ = step_tensors(arithmetic_steps, tok, torch.tensor([ids]), mask, [text], [{"answer": "2"}])
    assert ends.tolist() == [[9]]  # the EOS token's index, not 8


def test_a_step_reward_past_reward_timeout_fails_its_completion_alone():
    """Under reward_timeout a step reward found by name runs in worker processes, as rewards do: the call that
    hangs is cut at the deadline and fails that completion (counted as a failure), the others keep the steps
    the in-process call gives, and the pool is replaced so a later call scores."""
    from grpo.rewards.reward import RewardOptions
    from grpo.rewards.steps import StepRewardInWorkers, resolve_step_reward

    tok = build_tokenizer()
    fn = resolve_step_reward("tests.rewards_for_tests:steps_or_hang", RewardOptions(timeout=3.0, workers=1))
    assert isinstance(fn, StepRewardInWorkers)
    try:
        texts = ["1 + 1 = 2\n2", "hang", "1 + 1 = 3\n2"]
        enc = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        t_max = max(map(len, enc))
        ids = torch.tensor([e + [tok.pad_token_id] * (t_max - len(e)) for e in enc])  # [3, T]
        mask = torch.tensor([[1] * len(e) + [0] * (t_max - len(e)) for e in enc])  # [3, T]
        rewards, ends, problems = step_tensors(fn, tok, ids, mask, texts, [{"answer": "2"}] * 3)
        here, here_ends, _ = step_tensors(arithmetic_steps, tok, ids[[0, 2]], mask[[0, 2]], [texts[0], texts[2]],
                                          [{"answer": "2"}] * 2)
        assert torch.equal(rewards[[0, 2]], here) and torch.equal(ends[[0, 2]], here_ends)
        assert (ends[1] == -1).all() and len(problems) == 1 and "completion 1 (TimeoutError" in problems[0]
        assert fn.runner.timeouts == 1
        again, _, problems = step_tensors(fn, tok, ids[:1], mask[:1], texts[:1], [{"answer": "2"}])
        assert not problems and torch.equal(again, here[:1])
    finally:
        fn.close()
    assert not isinstance(resolve_step_reward("arithmetic_steps", RewardOptions(timeout=3.0)), StepRewardInWorkers)
    assert not isinstance(resolve_step_reward("tests.rewards_for_tests:steps_or_hang", RewardOptions(timeout=0.0)),
                          StepRewardInWorkers)
