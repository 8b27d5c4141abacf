"""The PPO baseline's value model: starts at value 0, and its values are a deterministic function of
the weights in training mode too (no dropout), so GAE sees the critic's estimate and processes agree."""

from __future__ import annotations

import torch

from grpo.train.critic import Critic, CriticSettings, load_value_model
from grpo.rollout import Rollout


def test_value_model_has_no_dropout_and_starts_at_zero(tiny_model_dir):
    model = load_value_model(str(tiny_model_dir), torch.float32)
    assert all(m.p == 0.0 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    assert any(isinstance(m, torch.nn.Dropout) for m in model.modules())  # the head has one, now off
    ids = torch.randint(0, 50, (3, 7))
    assert torch.equal(model(input_ids=ids).logits, torch.zeros(3, 7, 1))


def test_values_in_training_mode_repeat(tiny_model_dir):
    """Two value passes over the same rollout in training mode give the same values (with the 0.1
    dropout of Llama's token-classification head they did not)."""
    settings = CriticSettings(estimator="gae", learning_rate=1e-2, clip_range=0.2, max_grad_norm=1.0,
                              divergence_factor=10.0, vf_coef=0.1, shared_trunk=False, strategy="ddp", dtype="float32")
    critic = Critic(settings, str(tiny_model_dir), autocast=False)
    with torch.no_grad():
        critic.model.score.weight.normal_()  # non-zero values
    assert critic.model.training
    n, p, t = 4, 5, 6
    ro = Rollout(torch.randint(0, 50, (n, p)), torch.ones(n, p, dtype=torch.long), torch.randint(0, 50, (n, t)),
                 torch.ones(n, t, dtype=torch.long), torch.zeros(n, dtype=torch.bool), None, [""] * n, "test", 0.0)
    a, b = critic.values(ro, micro_batch=2), critic.values(ro, micro_batch=2)  # [N, T] each
    assert a.abs().sum() > 0 and torch.equal(a, b)
