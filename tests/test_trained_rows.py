"""The Updater asks the policy loss whether zero-advantage sequences matter: the rows it trains are
those the hand-written guard (its run clauses plus beta, entropy_coef and cov_mode) always gave."""

from types import SimpleNamespace

import pytest
import torch

from grpo import core
from grpo.config import Config, ConfigError
from grpo.infra import distributed
from grpo.train import split
from grpo.train.batch import Batch
from grpo.train.settings import update_settings
from grpo.train.update import Updater

G = 2


def _guard_rows(cfg, world, critic, batch, k):
    """The rows of the guard as it was written out clause by clause."""
    if (not cfg.skip_zero_advantage or world.distributed or cfg.num_iterations > 1 or cfg.mini_batches > 1
            or k.beta > 0 or k.entropy_coef > 0 or cfg.cov_mode is not None or critic is not None
            or cfg.entropy_target_band is not None):
        return torch.arange(batch.mask.shape[0])
    return split.rows_with_gradient(batch.advantages, batch.mask, group_size=cfg.num_generations)


CASES = [
    ({}, {}),  # the default: beta = 0.04
    (dict(beta=0.0), {}),
    (dict(beta=0.0, skip_zero_advantage=False), {}),
    (dict(beta=0.0, entropy_coef=0.01), {}),
    (dict(beta=0.0, cov_mode="clip_cov"), {}),
    (dict(beta=0.0, cov_mode="kl_cov", num_iterations=2), {}),
    (dict(beta=0.0, num_iterations=2), {}),
    (dict(beta=0.0, mini_batches=2), {}),
    (dict(beta=0.0, entropy_target_band=[0.5, 1.0]), {}),
    (dict(beta=0.0, dual_clip=3.0, importance_sampling_level="sequence", aggregation="token_mean",
          epsilon_high=0.28), {}),
    (dict(beta=0.0, aggregation="seq_mean_token_sum_norm", advantage_estimator="dr_grpo"), {}),
    (dict(beta=0.0), dict(world=2)),
    (dict(beta=0.0), dict(critic=True)),
    (dict(beta=0.04), dict(critic=True, kl_in_loss=False)),
    (dict(beta=0.04), dict(knob_beta=0.0)),  # an adaptive beta that reached 0
    (dict(beta=0.0, entropy_coef=0.01), dict(knob_entropy_coef=0.0)),
]


@pytest.mark.parametrize("overrides,run", CASES, ids=[f"{a}-{b}" for a, b in CASES])
def test_trained_rows_as_the_guard_gave(overrides, run):
    cfg = Config(num_generations=G, prompts_per_step=4, per_device_train_batch_size=8, **overrides)
    world = distributed.World(rank=0, size=run.get("world", 1))
    critic = object() if run.get("critic") else None
    upd = Updater.__new__(Updater)
    upd.settings, upd.world, upd.critic = update_settings(cfg), world, critic
    upd.loss = core.get_policy_loss(cfg.policy_loss)
    adv = torch.tensor([0.0, 0.0, 1.0, -1.0, 0.5, 0.0, 0.0, 0.0])[:, None].expand(8, 4).contiguous()  # [N, T]
    mask = torch.ones(8, 4)
    batch = Batch(None, adv, mask, None, None, kl_in_loss=run.get("kl_in_loss", True))
    k = SimpleNamespace(epsilon=cfg.epsilon, eps_high=cfg.eps_high, beta=run.get("knob_beta", cfg.beta),
                        entropy_coef=run.get("knob_entropy_coef", cfg.entropy_coef), temperature=cfg.temperature)
    got = upd.trained_rows(batch, upd.loss_settings(batch, k))
    assert torch.equal(got, _guard_rows(cfg, world, critic, batch, k))


def test_some_case_skips_rows():
    """The table above is not vacuous: with beta = 0 and nothing else, zero-advantage groups are skipped."""
    cfg = Config(num_generations=G, prompts_per_step=4, per_device_train_batch_size=8, beta=0.0)
    upd = Updater.__new__(Updater)
    upd.settings, upd.world, upd.critic = update_settings(cfg), distributed.World(), None
    upd.loss = core.get_policy_loss("clip")
    adv = torch.tensor([0.0, 0.0, 1.0, -1.0, 0.5, 0.0, 0.0, 0.0])[:, None].expand(8, 4).contiguous()
    k = SimpleNamespace(epsilon=0.2, eps_high=0.2, beta=0.0, entropy_coef=0.0, temperature=1.0)
    batch = Batch(None, adv, torch.ones(8, 4), None, None)
    assert upd.trained_rows(batch, upd.loss_settings(batch, k)).tolist() == [2, 3, 4]


def test_config_policy_loss_validated_against_the_registry():
    assert Config().policy_loss == "clip"
    with pytest.raises(ConfigError, match="policy_loss.*clip"):
        Config(policy_loss="nope")


@pytest.mark.parametrize("name", sorted(core.POLICY_LOSSES))
@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_zero_advantage_declaration_holds_on_a_tiny_model(tiny_model_dir, name, beta):
    """Through a real model's log-probs (every row shares the weights): where the entry declares that
    zero-advantage sequences change nothing, the weights' gradient with them in the forward equals the
    gradient without them (the denominator fixed); where it declares they matter (a KL term), it does not."""
    from transformers import AutoModelForCausalLM

    from grpo.models.logprobs import completion_logprobs

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    n, p, t = 6, 5, 4
    prompt_ids = torch.randint(3, 200, (n, p), generator=gen)  # [N, P]
    completion_ids = torch.randint(3, 200, (n, t), generator=gen)  # [N, T]
    prompt_mask, mask = torch.ones(n, p, dtype=torch.long), torch.ones(n, t, dtype=torch.long)
    adv = torch.tensor([0.0, 0.0, 1.0, -1.0, 0.5, -0.5])[:, None].expand(n, t)  # [N, T]: rows 0-1 zero
    with torch.no_grad():
        ref = completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, mask, temperature=1.0)["logp"] - 0.1
    entry = core.get_policy_loss(name)
    settings = dict(aggregation="token_mean", total=float(mask.sum()), kl_coef=beta)

    def grads(rows):
        model.zero_grad(set_to_none=True)
        logp = completion_logprobs(model, prompt_ids[rows], prompt_mask[rows], completion_ids[rows], mask[rows],
                                   temperature=1.0)["logp"]  # [n, T]
        out = core.policy_loss(logp, logp.detach(), adv[rows], mask[rows].float(), name=name, ref_logp=ref[rows],
                               **settings)
        out["loss"].backward()
        return torch.cat([q.grad.flatten() for q in model.parameters() if q.grad is not None])

    full, part = grads(torch.arange(n)), grads(torch.arange(2, n))
    same = torch.allclose(full, part, rtol=1e-5, atol=1e-8)
    if entry.zero_advantage_has_gradient(core.LossSettings(**settings)):
        assert not same, f"{name}: declared that zero-advantage rows matter, but they change nothing"
    else:
        assert same, f"{name}: declared that zero-advantage rows change nothing, but they do"
