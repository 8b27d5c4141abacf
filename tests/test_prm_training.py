"""A process reward model trained during the run (DeepSeekMath Algorithm 1 step 4 for step_reward=prm:): at each
iteration boundary the ended iteration's completions are step-labelled by the current policy and the PRM
trains on them with 10% of each batch replayed from earlier iterations; a resume continues it bit for bit."""

from __future__ import annotations

import json

import pytest

from grpo.config import Config
from grpo.errors import ConfigError
from tests.test_prm import prm_dir  # noqa: F401 (the fixture)
from tests.test_reward_model_training import _hash
from tests.test_trainer import make_cfg

VERIFIER = "tests.rewards_for_tests:has_digit"


def _trainer(prm_dir, **kw):
    from grpo.rewards.prm import PRMScorer
    from grpo.rewards.reward import RewardOptions
    from grpo.train.process_reward import ProcessRewardTrainer, ProcessRewardTrainSettings

    s = dict(train_steps=3, batch_size=10, replay=0.1, buffer_size=100, learning_rate=1e-3, heldout=0,
             verifier=VERIFIER, solutions=12, continuations=2, label="soft", rows_per_call=8, seed=3,
             reward_options=RewardOptions(timeout=0.0))
    return ProcessRewardTrainer(ProcessRewardTrainSettings(**{**s, **kw}), PRMScorer(str(prm_dir)))


def _engine(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo.rollout import make_engine
    from grpo.rollout.engine import SamplingSettings

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = make_engine("hf", AutoModelForCausalLM.from_pretrained(tiny_model_dir), tok)
    return engine, SamplingSettings(max_new_tokens=6, temperature=1.0, max_prompt_length=512), tok


def test_each_prm_update_replays_ten_percent_of_its_batch_from_earlier_iterations(prm_dir, tiny_model_dir,
                                                                                  monkeypatch):
    """Batches of 10 labelled solutions at reward_model_replay=0.1: the first iteration has nothing earlier, so
    none is replayed; from the second on, exactly one solution of every batch comes from the buffer (an
    earlier iteration's), and the logged share is 0.1. Every labelled step got the share of its continuations."""
    import grpo.train.process_reward as pr
    from grpo.data import render_prompt

    batches, labelled = [], []
    real, real_label = pr.step_loss, pr.label_solutions
    monkeypatch.setattr(pr, "step_loss", lambda model, tok, batch, *a, **k: batches.append(batch) or
                        real(model, tok, batch, *a, **k))

    def label(*a, **k):
        rows = real_label(*a, **k)
        labelled.extend(rows)
        return rows

    monkeypatch.setattr(pr, "label_solutions", label)
    engine, sampling, tok = _engine(tiny_model_dir)
    t = _trainer(prm_dir)
    samples = [{"prompt": f"What is {a} + 1?", "answer": str(a + 1)} for a in range(3)]
    metrics = []
    for it in range(2):
        texts = [f"step {'ab'[it]}{chr(97 + i)} one\nstep two\nso it" for i in range(12)]  # 3 steps, no digit
        t.observe(samples, texts, group_size=4)
        metrics.append(t.update(engine, sampling, lambda row: render_prompt(tok, row["prompt"], "")))
        assert not t.kept
    first, second = batches[:3], batches[3:]
    assert len(second) == 3 and all(len(b) == 10 for b in batches)
    assert all("iteration" not in r for b in first for r in b)  # nothing earlier to replay
    assert all(sum("iteration" in r for r in b) == 1 and [r["iteration"] for r in b if "iteration" in r] == [0]
               for b in second)  # one of ten from iteration 0's buffered solutions
    assert metrics[0]["prm_replay_share"] == 0.0 and metrics[1]["prm_replay_share"] == pytest.approx(0.1)
    assert metrics[1]["prm_buffer_size"] == 24 and metrics[1]["prm_iteration"] == 2
    assert len(labelled) == 24 and all("continuations" not in r for r in t.buffer)  # the texts stay out
    for r in labelled:  # the labels: the share of each continued step's continuations holding a digit
        assert len(r["steps"]) == 3 and len(r["continuations"]) == 2
        for k, drawn in enumerate(r["continuations"]):
            prefix = "\n".join(r["steps"][:k + 1]) + "\n"
            assert r["soft"][k] == sum(any(c.isdigit() for c in prefix + d) for d in drawn) / 2
    assert len({v for r in labelled for v in r["soft"][:2]}) > 1  # the continuations decided, not the prefix


def test_labels_drawn_a_few_rows_a_call_equal_those_drawn_at_once(tiny_model_dir):
    """label_solutions splits the continuations over generate calls (rows_per_call); each row keeps its key, so
    with an engine whose keys fix the tokens the labels and the continuations are those of one call."""
    from grpo.data import render_prompt
    from grpo.rewards import resolve_reward
    from grpo.rewards.reward import RewardOptions
    from grpo.train.prm_labels import label_solutions

    engine, sampling, tok = _engine(tiny_model_dir)
    owners = [{"prompt": f"What is {a} + 1?", "answer": str(a + 1)} for a in range(3)]
    solutions = ["first\nsecond\nthird", "one\ntwo", "alone"]
    prompts = [render_prompt(tok, o["prompt"], "") for o in owners]
    verifier = resolve_reward(VERIFIER, RewardOptions(timeout=0.0))
    got = {n: label_solutions(engine, solutions, owners, prompts, verifier, sampling, continuations=3, separator="\n",
                              keys=(5, 2), rows_per_call=n) for n in (3, 1000)}
    assert engine.same_tokens_for_keys and got[3] == got[1000]
    drawn = [c for r in got[3] for step in r["continuations"] for c in step]
    assert len(drawn) == 9 and len(set(drawn)) > 3  # 3 continued steps x 3 draws, each from its own key


def test_a_run_retrains_its_prm_and_a_resume_continues_it_bit_exactly(prm_dir, tmp_path, tiny_model_dir,
                                                                      tiny_dataset):
    """reward_model_train_steps with step_reward=prm:: the PRM scoring the steps is the one that learns (its
    weights move at each boundary, the metrics say so), and stopping at step 2 and resuming ends with the
    uninterrupted run's PRM, buffer and metrics."""
    from grpo.train.trainer import Trainer
    from tests.test_checkpoint import metric_lines

    kw = dict(supervision="process", step_reward=f"prm:{prm_dir}", reward_model_train_steps=2, ref_reset_steps=1,
              reward_model_verifier=VERIFIER, reward_model_heldout=2, reward_model_batch_size=3,
              reward_model_lr=1e-3, prm_label_solutions=4, prm_label_continuations=2, max_steps=3, eval_prompts=0)
    full = Trainer(make_cfg(tmp_path / "full", tiny_model_dir, tiny_dataset, **kw))
    assert full.prm_trainer.scorer is full.batches.step_reward  # the step reward is the model trained
    initial = _hash(full.prm_trainer.scorer.model.state_dict())
    full.train()
    final = _hash(full.prm_trainer.scorer.model.state_dict())
    assert final != initial
    lines = metric_lines(full.run_dir)
    assert "prm_loss" not in lines[0] and all(l["prm_labelled_solutions"] > 0 and "prm_loss" in l
                                              and "prm_heldout_step_accuracy_after" in l for l in lines[1:])
    part = Trainer(make_cfg(tmp_path / "part", tiny_model_dir, tiny_dataset, **{**kw, "max_steps": 2}))
    part.train()
    resumed = Trainer(make_cfg(tmp_path / "part", tiny_model_dir, tiny_dataset,
                               **{**kw, "resume_from_checkpoint": str(part.run_dir)}))
    assert resumed.step == 2 and len(resumed.prm_trainer.kept) == 8  # step 2's completions, to label at step 3
    resumed.train()
    assert _hash(resumed.prm_trainer.scorer.model.state_dict()) == final
    assert json.dumps(resumed.prm_trainer.buffer) == json.dumps(full.prm_trainer.buffer)
    assert metric_lines(resumed.run_dir) == lines


@pytest.mark.parametrize("kw,field", [
    ({"reward_model_train_steps": 2, "ref_reset_steps": 2}, "step_reward=prm:"),
    ({"reward_model_train_steps": 2, "ref_reset_steps": 2, "supervision": "process", "step_reward": "prm:x",
      "prm_label": "any"}, "prm_label"),
    ({"reward_model_train_steps": 2, "ref_reset_steps": 2, "supervision": "process", "step_reward": "prm:x",
      "prm_label_continuations": 0}, "prm_label_continuations"),
    ({"reward_model_train_steps": 2, "ref_reset_steps": 2, "supervision": "process", "step_reward": "prm:x",
      "async_rollouts": True}, "async_rollouts"),
    ({"reward_model_train_steps": 2, "ref_reset_steps": 2, "supervision": "process", "step_reward": "prm:x",
      "reward_model_warmup_draws": 4}, "reward_model_warmup_draws"),
])
def test_bad_prm_training_settings_name_their_field(kw, field):
    with pytest.raises(ConfigError, match=field):
        Config(model="unused", **kw)
