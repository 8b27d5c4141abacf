"""The two forms of a reward (grpo's per completion, TRL's per batch) told apart by signature; None as
"not applicable to this row"; a reward of the wrong shape stopped with an error naming it."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from grpo.errors import ConfigError
from grpo.rewards import score_completions
from grpo.rewards.forms import RewardShapeError, is_batch_reward
from grpo.rewards.reward import RewardOptions
from grpo.rewards.runner import RewardRunner

SAMPLES = [{"prompt": "What is 1 + 2?", "answer": "3", "city": "Lyon"},
           {"prompt": "What is 2 + 2?", "answer": "4", "city": "Paris"}]
TEXTS = ["The answer is 3", "5"]


def per_completion(completion, sample):
    return float(completion.endswith(sample["answer"]))


def trl_form(completions, answer, **kwargs):
    return [float(c.endswith(a)) for c, a in zip(completions, answer)]


def test_the_form_is_read_from_the_signature():
    assert is_batch_reward(trl_form) and not is_batch_reward(per_completion)
    assert is_batch_reward(lambda prompts, completions, **kw: [])
    assert not is_batch_reward(len)  # a builtin: no signature to read, per completion


def test_both_forms_score_alike():
    """The same reward in either form gives the same values, total and failures."""
    a = score_completions(TEXTS, SAMPLES, {"r": per_completion})
    b = score_completions(TEXTS, SAMPLES, {"r": trl_form})
    assert a.total.tolist() == b.total.tolist() == [1.0, 0.0] and a.failures == b.failures == {"r": 0}


def test_a_batch_reward_gets_what_trl_passes_once_per_batch():
    seen = []

    def spy(prompts, completions, completion_ids, trainer_state, log_extra, log_metric, **columns):
        seen.append(dict(prompts=prompts, completions=completions, ids=completion_ids, step=trainer_state.global_step,
                         columns=columns))
        log_metric("spy/calls", 1.0)
        log_extra("mark", ["x", "y"])
        return [1.0, None]

    state = SimpleNamespace(global_step=7, max_steps=9)
    res = score_completions(TEXTS, SAMPLES, {"spy": spy}, completion_ids=[[5, 6], [7]], trainer_state=state)
    assert len(seen) == 1  # one call for the batch
    assert seen[0] == dict(prompts=[s["prompt"] for s in SAMPLES], completions=TEXTS, ids=[[5, 6], [7]], step=7,
                           columns={"answer": ["3", "4"], "city": ["Lyon", "Paris"]})
    assert res.log_metrics == {"spy/calls": [1.0]} and res.log_columns == {"mark": ["x", "y"]}


def test_conversational_prompts_give_message_completions_as_trl_does():
    got = {}

    def spy(completions, **kw):
        got["c"] = completions
        return [0.0] * len(completions)

    chat = [{**s, "prompt": [{"role": "user", "content": s["prompt"]}]} for s in SAMPLES]
    score_completions(TEXTS, chat, {"spy": spy})
    assert got["c"] == [[{"role": "assistant", "content": t}] for t in TEXTS]


def test_a_batch_reward_without_kwargs_gets_only_what_it_names():
    def named(completions, city):
        return [float(c == "5" and y == "Paris") for c, y in zip(completions, city)]

    assert score_completions(TEXTS, SAMPLES, {"named": named}).total.tolist() == [0.0, 1.0]

    def wants_solution(completions, solution):
        return [0.0] * len(completions)

    with pytest.raises(ConfigError, match=r"^rewards: 'w' takes 'solution', which is neither one of TRL's reward "
                                          r"arguments .* nor a column of the dataset \(columns: answer, city\)$"):
        score_completions(TEXTS, SAMPLES, {"w": wants_solution})


def test_grpo_batch_rewards_may_name_samples():
    def rows(completions, samples):
        return [float(s["city"] == "Lyon") for s in samples]

    assert score_completions(TEXTS, SAMPLES, {"rows": rows}).total.tolist() == [1.0, 0.0]


def test_none_is_not_applicable_and_a_row_no_reward_applies_to_is_a_failure():
    """Hand-computed: weights 2 and 3; reward a applies to row 0 only, b to rows 0 and 1, neither to
    row 2; row 3's a raises (the row fails whatever b says)."""
    def a(completion, sample):
        if completion == "boom":
            raise RuntimeError("broken")
        return 1.0 if completion == "x" else None

    def b(completions, **kw):
        return [0.5, 1.0, None, 1.0]

    res = score_completions(["x", "y", "z", "boom"], [{"prompt": "p"}] * 4, {"a": a, "b": b}, [2.0, 3.0])
    total = res.total.tolist()
    assert total[:2] == [2.0 * 1.0 + 3.0 * 0.5, 3.0 * 1.0] and math.isnan(total[2]) and math.isnan(total[3])
    assert res.not_applicable == {"a": 2, "b": 1} and res.failures == {"a": 1, "b": 0} and res.unscorable == 1
    assert res.failed.tolist() == [False, False, True, True]
    assert any("no reward applied" in m for m in res.messages)


@pytest.mark.parametrize("fn, message", [
    (lambda completion, sample: [0.0, 0.0], r"^rewards: 'r' returned a list \(2 values\) for one completion: .*"
                                            r"takes a parameter named `completions`$"),
    (lambda completion, sample: "0.5", r"^rewards: 'r' returned str '0.5', not a number or None$"),
    (lambda completions, **kw: [1.0], r"^rewards: 'r' returned 1 values for 2 completions"),
    (lambda completions, **kw: "0.5", r"^rewards: 'r' \(TRL's batch form: it takes `completions`\) returned str"),
    (lambda completions, **kw: [[1.0], [0.0]], r"^rewards: 'r' returned list \[1.0\] in its list, not a number"),
], ids=["list-per-completion", "string", "wrong-length", "batch-string", "nested"])
def test_a_value_of_the_wrong_shape_stops_with_the_rewards_name(fn, message):
    with pytest.raises(RewardShapeError, match=message):
        score_completions(TEXTS, SAMPLES, {"r": fn})


def test_nan_and_inf_and_raising_stay_counted_failures():
    vals = iter([float("nan"), float("inf")])
    res = score_completions(TEXTS, SAMPLES, {"r": lambda completion, sample: next(vals)})
    assert res.failures == {"r": 2} and res.failed.all()
    res = score_completions(TEXTS, SAMPLES, {"r": lambda completions, **kw: 1 / 0})
    assert res.failures == {"r": 2} and res.failed.all() and "ZeroDivisionError" in res.messages[0]


def test_numpy_and_tensor_values_are_numbers():
    np = pytest.importorskip("numpy")
    res = score_completions(TEXTS, SAMPLES, {"r": lambda completions, **kw: np.array([0.25, 1.0])})
    assert res.total.tolist() == [0.25, 1.0]
    res = score_completions(TEXTS, SAMPLES, {"r": lambda completion, sample: torch.tensor(0.5)})
    assert res.total.tolist() == [0.5, 0.5]


def test_an_async_batch_reward_is_awaited_once_per_batch():
    calls = []

    async def a(completions, **kw):
        calls.append(len(completions))
        return [float(len(c)) for c in completions]

    assert score_completions(TEXTS, SAMPLES, {"a": a}).total.tolist() == [15.0, 1.0] and calls == [2]


def test_episodes_give_message_completions_and_environments():
    class Env:
        def __init__(self, score):
            self.score = score

    got = {}

    def env_reward(environments, completions, **kw):
        got["c"] = completions
        return [e.score for e in environments]

    turns = [{"role": "assistant", "content": "calc(1 + 2)"}, {"role": "tool", "content": "3"},
             {"role": "assistant", "content": "3"}]
    eps = [{"transcript": [{"role": "user", "content": "q"}] + turns, "completion_messages": turns, "environment": Env(s),
            "turns": 2} for s in (0.25, 0.75)]
    res = score_completions(["3", "3"], SAMPLES, {"e": env_reward}, episodes=eps)
    assert res.total.tolist() == [0.25, 0.75] and got["c"] == [turns, turns]
    # grpo's per-completion form sees the episode's counts beside the sample, not the instance
    res = score_completions(["3", "3"], SAMPLES, {"p": lambda completion, sample: float(sample["turns"])}, episodes=eps)
    assert res.total.tolist() == [2.0, 2.0]


def test_with_a_deadline_batch_rewards_run_here_and_per_completion_ones_in_workers():
    runner = RewardRunner(["tests.rewards_for_tests:trl_digit_share", "tests.rewards_for_tests:digit_share"], None,
                          RewardOptions(timeout=20.0, retries=0))
    try:
        assert runner._worker_names == ["tests.rewards_for_tests:digit_share"]
        texts = ["a1", "22", "xyz"]
        res = runner.score(texts, [{"prompt": "p", "answer": "1"}] * 3, completion_ids=[[1], [2], [3]],
                           trainer_state=SimpleNamespace(global_step=0, max_steps=3))
        per = {k: v.tolist() for k, v in res.per_reward.items()}
        assert per["tests.rewards_for_tests:trl_digit_share"] == per["tests.rewards_for_tests:digit_share"] == [0.5, 1.0, 0.0]
    finally:
        runner.close()


def test_gdpo_gives_a_score_that_does_not_apply_zero_weight():
    """normalize_then_sum: a reward's missing score (None) takes its group's mean, so it adds exactly 0
    to the normalised sum, as if the row had only the other rewards."""
    from grpo.core import gdpo_advantages
    from grpo.train.batch import BatchMaker

    settings = SimpleNamespace(multi_objective_aggregation="normalize_then_sum", reward_weights=None, std_eps=1e-6,
                               unbiased_std=True)
    per = torch.tensor([[[1.0, 0.0], [0.0, float("nan")], [1.0, 1.0]]])  # [B=1, G=3, K=2]
    failed = torch.zeros(1, 3, dtype=torch.bool)
    got = BatchMaker._advantages(SimpleNamespace(settings=settings), torch.zeros(1, 3), failed, per)
    filled = per.clone()
    filled[0, 1, 1] = 0.5  # the group's mean of reward 2
    assert torch.allclose(got, gdpo_advantages(filled, torch.ones(2)))
    assert torch.isfinite(got).all()


def _train(tmp_path, tiny_model_dir, tiny_dataset, name: str, rewards: str) -> list[str]:
    from tests.conftest import TEST_BF16, TEST_SEED

    return ["train", f"model={tiny_model_dir}", f"task={tiny_dataset}", f"output_dir={tmp_path / name}",
            "num_generations=4", "prompts_per_step=2", "per_device_train_batch_size=4", "max_completion_length=6",
            "eval_prompts=0", "progress=false", "report_to=none", "max_steps=2", f"rewards={rewards}",
            f"bf16={TEST_BF16}", f"seed={TEST_SEED}", "learning_rate=1e-2"]


def test_a_run_scored_in_either_form_is_the_same_run(tmp_path, tiny_model_dir, tiny_dataset, capsys):
    """digit_share per completion and in TRL's batch form: the same rewards, losses and updates."""
    import json

    from grpo.cli import main

    for name, reward in (("per", "tests.rewards_for_tests:digit_share"), ("trl", "tests.rewards_for_tests:trl_digit_share")):
        assert main(_train(tmp_path, tiny_model_dir, tiny_dataset, name, reward)) == 0
    capsys.readouterr()
    keys = ("reward_mean", "loss", "grad_norm", "reward_failures")
    lines = {n: [json.loads(l) for l in (tmp_path / n / "metrics.jsonl").read_text().splitlines()] for n in ("per", "trl")}
    assert [[l[k] for k in keys] for l in lines["per"]] == [[l[k] for k in keys] for l in lines["trl"]]
    assert all(l["reward_failures"] == 0 for l in lines["trl"])


@pytest.mark.parametrize("reward", ["returns_a_list", "trl_returns_a_string"])
def test_a_reward_of_the_wrong_shape_stops_the_run_at_its_first_step(tmp_path, tiny_model_dir, tiny_dataset, capsys,
                                                                       reward):
    from grpo.cli import main

    name = f"tests.rewards_for_tests:{reward}"
    assert main(_train(tmp_path, tiny_model_dir, tiny_dataset, "bad", name)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"grpo train: error: rewards: {name!r} ") and "Traceback" not in "".join(err)
    assert not (tmp_path / "bad" / "metrics.jsonl").exists() or not (tmp_path / "bad" / "metrics.jsonl").read_text()
