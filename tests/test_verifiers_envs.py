"""verifiers environments (verifiers 0.4, written with the installed package on local data:
tests/vf_envs/) trained with grpo's loop on the tiny model: task=verifiers:<id> brings the dataset, the
environment's own multi-turn run and its rubric as the reward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo.config import Config
from tests.conftest import TEST_SEED, import_or_skip_unless_ci

ENVS = Path(__file__).parent / "vf_envs"


@pytest.fixture(autouse=True)
def on_path(monkeypatch):
    import_or_skip_unless_ci("verifiers", "the verifiers package (the envs extra)")
    monkeypatch.syspath_prepend(str(ENVS))  # verifiers imports an environment id's module by name


def test_the_taskset_is_the_dataset_and_the_task_is_found_again():
    from grpo.agent.verifiers_env import VerifiersProgram
    from grpo.data.verifiers_tasks import verifiers_rows

    rows = verifiers_rows("verifiers:grpo-vf-sum")
    assert len(rows) == 18 and rows[0]["prompt"][-1]["role"] == "user"
    assert {r["answer"] for r in rows} == {str(a + b) for a in range(1, 7) for b in range(1, 4)}
    guess = verifiers_rows("verifiers:grpo-vf-guess")
    assert guess[0]["prompt"][0] == {"role": "system", "content": "Guess my secret digit from 0 to 9. Reply with one digit."}
    program = VerifiersProgram("verifiers:grpo-vf-guess")
    assert set(program.tasks) == {r["verifiers_key"] for r in guess}


def test_an_episode_follows_the_environments_protocol_and_scores_with_its_rubric():
    """A scripted client plays the guessing game: the environment's replies reach it, and the reward is the
    task's (solved 1.0, less 0.1 per turn)."""
    from grpo.agent.verifiers_env import VerifiersProgram
    from grpo.data.verifiers_tasks import verifiers_rows

    program = VerifiersProgram("verifiers:grpo-vf-guess")
    row = next(r for r in verifiers_rows("verifiers:grpo-vf-guess") if r["info"].get("secret") == 7)
    seen = []
    client = _Client(["5", "8", "7"], seen)
    assert program(client, row) == pytest.approx(1.0 - 0.3)
    assert [m["content"] for m in seen[1] if m["role"] == "user"][-1] == "5 is too low."
    assert [m["content"] for m in seen[2] if m["role"] == "user"][-1] == "8 is too high."
    assert seen[2][:len(seen[1])] == seen[1]  # each call extends the last: one sample for the trainer
    assert program(_Client(["x", "x", "x"], []), row) == pytest.approx(-0.3)  # never solved, 3 turns


@pytest.mark.parametrize("env,calls", [("grpo-vf-sum", 1), ("grpo-vf-guess", 3)])
def test_a_verifiers_environment_trains_three_steps_with_its_own_rewards(tmp_path, tiny_model_dir, env, calls):
    cfg = Config(model=str(tiny_model_dir), task=f"verifiers:{env}", output_dir=str(tmp_path / "run"), max_steps=3,
                 num_generations=2, prompts_per_step=2, per_device_train_batch_size=4, max_completion_length=64,
                 eval_prompts=2, learning_rate=1e-3, progress=False, report_to="none", seed=TEST_SEED,
                 rollout_engine="fast")
    assert (cfg.rewards, cfg.agent) == ("agent", f"verifiers:{env}")  # the environment's rubric, its protocol
    from grpo.train.trainer import Trainer

    Trainer(cfg).train()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3]
    for line in lines:
        assert line["reward_failures"] == 0 and line["agent/errors"] == 0, line
        assert line["agent/calls_per_episode"] <= calls and line["agent/calls_per_episode"] >= (1 if calls == 1 else 2)
    if env == "grpo-vf-guess":  # the rubric's turn penalty shows: never above 1 - 0.1, below 0 when unsolved
        assert all(line["reward_mean"] <= 0.9 for line in lines)


class _Client:
    """An OpenAI-client stand-in that replies from a script and keeps the messages it was sent (the episode's
    protocol is what is tested here; the real client and endpoint run in the training test)."""

    def __init__(self, replies, seen):
        self.replies, self.seen = list(replies), seen
        self.chat = self
        self.completions = self

    def create(self, *, model, messages):
        self.seen.append([dict(m) for m in messages])
        text = self.replies.pop(0)
        return type("R", (), {"choices": [type("C", (), {"message": type("M", (), {"content": text})()})()]})()
