"""A reward model trained during the run (seed 001 Algorithm 1 step 4): the replay mix by count, the
metrics it logs, and a resume that continues it bit for bit."""

from __future__ import annotations

import hashlib

import pytest
import torch

from grpo.config import Config
from grpo.core import distillation_loss
from grpo.rewards.reward_model import RewardModelScorer
from grpo.train.reward_model import RewardModelTrainer, replay_count
from grpo.train.settings import reward_model_settings
from tests.conftest import TEST_SEED, build_tiny_reward_model, build_tokenizer
from tests.test_trainer import make_cfg

VERIFIER = "tests.rewards_for_tests:digit_share"
# update steps and learning rate on the separable toy: the pointwise loss orders the pairs well before the
# letters' logits cross zero (at 20 steps one seed's sat at +0.006), so it gets more steps to learn the sign
# too, at a smaller rate (at 1e-2 and 40 steps 2 of 16 data seeds oscillated; at 3e-3 and 80, 16 of 16 learned)
STEPS = {"pointwise": 80, "pairwise": 20}
LR = {"pointwise": 3e-3, "pairwise": 1e-2}  # pairwise at 1e-2 and 20 steps: 16 of 16


@pytest.fixture(scope="module")
def tiny_rm_dir(tmp_path_factory):
    return build_tiny_reward_model(tmp_path_factory.mktemp("tiny-rm-train"))


def test_replay_count_by_hand():
    assert replay_count(16, fraction=0.1, have_old=True) == 2  # round(1.6)
    assert replay_count(10, fraction=0.1, have_old=True) == 1
    assert replay_count(10, fraction=0.1, have_old=False) == 0  # nothing earlier yet
    assert replay_count(2, fraction=0.9, have_old=True) == 1  # every batch keeps new data
    assert replay_count(10, fraction=0.0, have_old=True) == 0


def _groups(n: int, g: int, offset: int) -> tuple[list[dict], list[str]]:
    samples = [{"prompt": f"What is {offset + i} + 1?", "answer": str(offset + i + 1)} for i in range(n)]
    texts = [f"{'7' * (j + 1)} apples {i}" for i in range(n) for j in range(g)]  # digit shares differ in a group
    return samples, texts


@pytest.mark.parametrize("objective", ["pointwise", "pairwise"])
def test_each_update_mixes_replay_by_count(tiny_rm_dir, objective):
    cfg = Config(model="unused", reward_model=str(tiny_rm_dir), reward_model_train_steps=3, ref_reset_steps=1,
                 reward_model_batch_size=10, reward_model_replay=0.2, reward_model_verifier=VERIFIER,
                 reward_model_heldout=1, reward_model_objective=objective, num_generations=4, prompts_per_step=2,
                 per_device_train_batch_size=4, reward_model_lr=1e-3)
    t = RewardModelTrainer(reward_model_settings(cfg), RewardModelScorer(str(tiny_rm_dir), device="cpu"))
    batches = []
    step = t._step
    t._step = lambda batch: (batches.append(batch), step(batch))[1]
    t.observe(*_groups(3, 4, 0))  # group 0 is held out, groups 1-2 train
    assert len(t.heldout) == 4 and len(t.current) == 8
    before = {k: v.clone() for k, v in t.scorer.model.state_dict().items()}
    first = t.update()
    assert all(len(b) == 10 for b in batches) and first["rm_replay_share"] == 0.0  # no earlier iteration yet
    assert first["rm_buffer_size"] == 8 and first["rm_buffer_age_mean"] == 1.0
    assert any(not torch.equal(before[k], v) for k, v in t.scorer.model.state_dict().items())
    batches.clear()
    t.observe(*_groups(2, 4, 10))
    # the metrics of the model as it is before the update, and (below) as it is after it
    want = {"rm_heldout_accuracy_before": t.accuracy(t.heldout), "rm_agreement_new": t.accuracy(t.current)}
    losses = []
    t._step = lambda batch: (batches.append(batch), losses.append(step(batch)), losses[-1])[2]
    second = t.update()

    def iteration(item):
        return (item[0] if objective == "pairwise" else item).iteration
    # 20% of each batch of 10 comes from the buffer (iteration 0), by count, in every step
    assert [sum(iteration(x) == 0 for x in b) for b in batches] == [2, 2, 2]
    assert all(sum(iteration(x) == 1 for x in b) == 8 for b in batches)
    assert second["rm_replay_share"] == pytest.approx(0.2) and second["rm_buffer_size"] == 16
    assert second["rm_buffer_age_mean"] == pytest.approx(1.5)  # 8 examples of age 2, 8 of age 1
    want.update(rm_heldout_accuracy_after=t.accuracy(t.heldout), rm_loss=sum(losses) / 3)
    assert {k: second[k] for k in want} == pytest.approx(want)


def _separable_groups(n: int, seed: int) -> tuple[list[dict], list[str]]:
    """n groups of 4: two completions of digits only (digit share 1: good) and two of letters only (0: bad),
    in alternating order, of random characters and lengths."""
    import random

    rng = random.Random(seed)

    def word(chars: str) -> str:
        return "".join(rng.choice(chars) for _ in range(rng.randint(4, 9)))
    samples = [{"prompt": f"Say something {i}", "answer": ""} for i in range(n)]
    texts = [w for _ in range(n) for w in (word("0123456789"), word("abcdefghij"), word("0123456789"),
                                           word("abcdefghij"))]
    return samples, texts


@pytest.mark.parametrize("objective", ["pointwise", "pairwise"])
def test_heldout_metrics_by_hand_and_learning_on_a_separable_toy(tiny_rm_dir, objective):
    """Held-out metrics equal a count by hand from the model's own scores (sign against the label;
    digit completions above letter ones within a group), before and after the update; and the update
    learns the rule: every held-out completion and pair right afterwards, where the untrained model
    was not."""
    cfg = Config(model="unused", reward_model=str(tiny_rm_dir), reward_model_train_steps=STEPS[objective],
                 ref_reset_steps=1, reward_model_batch_size=8, reward_model_verifier=VERIFIER, reward_model_heldout=2,
                 reward_model_objective=objective, num_generations=4, prompts_per_step=2,
                 per_device_train_batch_size=4, reward_model_lr=LR[objective])
    t = RewardModelTrainer(reward_model_settings(cfg), RewardModelScorer(str(tiny_rm_dir), device="cpu"))
    t.observe(*_separable_groups(8, seed=TEST_SEED))  # groups 0-1 held out, 2-7 train
    assert [e.label for e in t.heldout] == [1.0, 0.0, 1.0, 0.0] * 2

    def by_hand() -> tuple[float, float]:
        s = t.scorer.score([e.prompt for e in t.heldout], [e.completion for e in t.heldout])  # one-label: logits
        right = sum((x > 0) == (e.label >= 0.5) for x, e in zip(s, t.heldout))
        pairs = [(s[g + i], s[g + j]) for g in (0, 4) for i in (0, 2) for j in (1, 3)]  # (digits, letters)
        return right / 8, sum(a > b for a, b in pairs) / 8

    accuracy_before, ranking_before = by_hand()
    m = t.update()
    accuracy_after, ranking_after = by_hand()
    assert m["rm_heldout_ranking_before"] == pytest.approx(ranking_before)
    assert m["rm_heldout_ranking_after"] == pytest.approx(ranking_after)
    assert ranking_before < ranking_after == 1.0  # every held-out pair ordered right only after training
    if objective == "pointwise":
        assert m["rm_heldout_accuracy_before"] == pytest.approx(accuracy_before)
        assert m["rm_heldout_accuracy_after"] == pytest.approx(accuracy_after)
        assert accuracy_before < accuracy_after  # the sign learned too (the untrained head's is one for all)
    else:
        assert (m["rm_heldout_accuracy_before"], m["rm_heldout_accuracy_after"]) == (ranking_before, ranking_after)


def test_ranking_accuracy_by_hand_under_either_objective(tiny_rm_dir):
    """Within-group pairs ordered as the verifier orders them, counted by hand; logged for pointwise too,
    where the thresholded accuracy is near the majority label's share."""
    cfg = Config(model="unused", reward_model=str(tiny_rm_dir), reward_model_train_steps=1, ref_reset_steps=1,
                 reward_model_verifier=VERIFIER, reward_model_heldout=1, reward_model_objective="pointwise",
                 num_generations=4, prompts_per_step=2, per_device_train_batch_size=4)
    t = RewardModelTrainer(reward_model_settings(cfg), RewardModelScorer(str(tiny_rm_dir), device="cpu"))
    t.observe(*_groups(2, 4, 0))
    labels = [e.label for e in t.heldout]
    assert labels == sorted(labels) and len(set(labels)) == 4  # digit shares rise along the group
    # pairs (better, worse) of 4 distinct labels: 6; scores ranking the best two wrongly get 5 of 6 right
    by_label = {0: 0.0, 1: 1.0, 2: 3.0, 3: 2.0}
    t._scores = lambda ex: torch.tensor([by_label[sorted(labels).index(e.label)] for e in ex])
    assert t.ranking_accuracy(t.heldout) == pytest.approx(5 / 6)
    assert t.ranking_accuracy([t.heldout[0]]) is None  # no pair to judge
    metrics = t.update()
    assert metrics["rm_heldout_ranking_before"] == pytest.approx(5 / 6)
    assert metrics["rm_heldout_ranking_after"] == pytest.approx(5 / 6)


def _hash(state: dict) -> str:
    h = hashlib.sha256()
    for k, v in sorted(state.items()):
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def test_resume_continues_the_reward_model_bit_exactly(tmp_path, tiny_model_dir, tiny_dataset, tiny_rm_dir):
    from grpo.train.trainer import Trainer
    from tests.test_checkpoint import metric_lines

    kw = dict(rewards="reward_model", reward_model=str(tiny_rm_dir), reward_model_train_steps=2, ref_reset_steps=1,
              reward_model_verifier=VERIFIER, reward_model_heldout=1, reward_model_batch_size=4,
              reward_model_lr=1e-3, reward_model_objective="pairwise", max_steps=3, eval_prompts=0, beta=0.05)
    full = Trainer(make_cfg(tmp_path / "full", tiny_model_dir, tiny_dataset, **kw))
    initial = _hash(full.rm_trainer.scorer.model.state_dict())
    full.train()
    part = Trainer(make_cfg(tmp_path / "part", tiny_model_dir, tiny_dataset, **{**kw, "max_steps": 2}))
    part.train()
    resumed = Trainer(make_cfg(tmp_path / "part", tiny_model_dir, tiny_dataset,
                               **{**kw, "resume_from_checkpoint": str(part.run_dir)}))
    assert resumed.step == 2 and len(resumed.rm_trainer.buffer) == len(part.rm_trainer.buffer) > 0
    resumed.train()
    final = _hash(full.rm_trainer.scorer.model.state_dict())
    assert final != initial  # the reward model did learn
    assert _hash(resumed.rm_trainer.scorer.model.state_dict()) == final
    assert [vars(e) for e in resumed.rm_trainer.buffer] == [vars(e) for e in full.rm_trainer.buffer]
    lines = metric_lines(full.run_dir)
    assert metric_lines(resumed.run_dir) == lines
    # steps 2-3 log the buffer, and the held-out accuracy where a held-out group mixes labels (pairwise:
    # the seed decides that)
    has_pairs = full.rm_trainer.ranking_accuracy(full.rm_trainer.heldout) is not None
    assert all("rm_buffer_size" in l and ("rm_heldout_accuracy_after" in l) == has_pairs for l in lines[1:])
    # the reward the policy trains on is the model being trained
    assert resumed.rewards.reward_model().scorer is resumed.rm_trainer.scorer


def test_warm_up_trains_the_reward_model_before_its_first_use(tmp_path, tiny_model_dir, tiny_dataset, tiny_rm_dir):
    """reward_model_warmup_draws: the reward model that scores step 1 has already trained on labelled
    samples of the initial policy (held-out set from them), drawn from their own prompt stream and
    keys, so the policy's prompts and first samples are those of the run without the warm-up."""
    from grpo.train.trainer import Trainer
    from tests.test_checkpoint import metric_lines

    kw = dict(rewards="reward_model", reward_model=str(tiny_rm_dir), reward_model_train_steps=2, ref_reset_steps=2,
              reward_model_verifier=VERIFIER, reward_model_heldout=2, reward_model_batch_size=4,
              reward_model_lr=1e-3, reward_model_objective="pairwise", max_steps=2, eval_prompts=0, beta=0.05)
    seen = {}
    for name, draws in (("plain", 0), ("warm", 3)):
        t = Trainer(make_cfg(tmp_path / name, tiny_model_dir, tiny_dataset, reward_model_warmup_draws=draws, **kw))
        initial = _hash(t.rm_trainer.scorer.model.state_dict())
        got, collect, scored = [], t.collector.collect, []
        t.collector.collect = lambda **a: (got.append(collect(**a)), got[-1])[1]
        score = t.rm_trainer.scorer.score
        t.rm_trainer.scorer.score = lambda *a: (scored.append(_hash(t.rm_trainer.scorer.model.state_dict())),
                                                score(*a))[1]
        t.train()
        seen[name] = dict(prompts=[[s["prompt"] for s in c.samples] for c in got], texts=got[0].rollout.texts,
                          lines=metric_lines(t.run_dir), initial=initial, scored=scored, heldout=len(t.rm_trainer.heldout),
                              heldout_pairs=len(t.rm_trainer._pairs(t.rm_trainer.heldout)))
    plain, warm = seen["plain"], seen["warm"]
    assert warm["prompts"] == plain["prompts"] and warm["texts"] == plain["texts"]
    assert plain["scored"][0] == plain["initial"]  # without it, step 1 is scored by the untrained head
    assert warm["scored"][0] != warm["initial"]  # with it, by a model that has trained
    first = warm["lines"][0]
    assert first["rm_warmup_completions"] == 3 * 2 * 4 and first["rm_iteration"] == 1
    assert warm["heldout"] == 2 * 4  # the held-out groups are the warm-up's first two
    assert first["rm_buffer_size"] == (3 * 2 - 2) * 4
    # pairwise held-out accuracy exists where a held-out group mixes labels (the seed decides that)
    assert ("rm_heldout_accuracy_after" in first) == (warm["heldout_pairs"] > 0)
    assert "rm_warmup_completions" not in plain["lines"][0] and "rm_iteration" not in plain["lines"][0]
    assert all(0.0 <= line["rm_verifier_reward"] <= 1.0 for line in warm["lines"] + plain["lines"])


def test_distillation_from_a_teacher_moves_the_student_to_its_logits(tiny_rm_dir, tmp_path):
    from transformers import AutoModelForSequenceClassification

    teacher_dir = tmp_path / "teacher"
    torch.manual_seed(1)
    teacher_model = AutoModelForSequenceClassification.from_pretrained(str(tiny_rm_dir))
    with torch.no_grad():
        teacher_model.score.weight.normal_(0, 2.0)  # a different, confident head
    teacher_model.save_pretrained(teacher_dir)
    build_tokenizer().save_pretrained(teacher_dir)
    cfg = Config(model="unused", reward_model=str(tiny_rm_dir), reward_model_train_steps=8, ref_reset_steps=1,
                 reward_model_batch_size=8, reward_model_verifier=VERIFIER, reward_model_heldout=0,
                 reward_model_teacher=str(teacher_dir), num_generations=4, prompts_per_step=2,
                 per_device_train_batch_size=4, reward_model_lr=3e-3)
    teacher = RewardModelScorer(str(teacher_dir), device="cpu")
    t = RewardModelTrainer(reward_model_settings(cfg), RewardModelScorer(str(tiny_rm_dir), device="cpu"), teacher)
    samples, texts = _groups(2, 4, 0)
    t.observe(samples, texts)
    want = teacher.score([s["prompt"] for s in samples for _ in range(4)], texts)
    assert [e.teacher[0] for e in t.current] == pytest.approx(want, abs=1e-5)  # the teacher's logits are kept

    examples = list(t.current)  # update() hands them to the buffer

    def gap() -> float:
        with torch.no_grad():
            got = t._logits(t.scorer, [e.prompt for e in examples], [e.completion for e in examples])
            return float(distillation_loss(got, torch.tensor([e.teacher for e in examples])))
    before = gap()
    t.update()
    assert gap() < before


@pytest.mark.parametrize("kw, field", [
    ({"reward_model_train_steps": 2, "ref_reset_steps": 2}, "set reward_model"),
    ({"reward_model_train_steps": 2, "reward_model": "x"}, "ref_reset_steps"),
    ({"reward_model_train_steps": 2, "reward_model": "x", "ref_reset_steps": 2, "reward_model_replay": 1.0},
     "reward_model_replay"),
    ({"reward_model_train_steps": 2, "reward_model": "x", "ref_reset_steps": 2, "reward_model_objective": "listwise"},
     "reward_model_objective"),
    ({"reward_model_train_steps": 2, "reward_model": "x", "ref_reset_steps": 2, "reward_model_warmup_draws": 2,
      "prompts_per_step": 4, "reward_model_heldout": 8}, "reward_model_warmup_draws: 2 draw"),
    ({"reward_model_warmup_draws": 2}, "reward_model_warmup_draws"),
    ({"resample_invalid_rounds": -1}, "resample_invalid_rounds"),
    ({"token_weight_gamma": 0.0}, "token_weight_gamma"),
])
def test_bad_settings_name_their_field(kw, field):
    from grpo.errors import ConfigError

    with pytest.raises(ConfigError, match=field):
        Config(model="unused", **kw)
