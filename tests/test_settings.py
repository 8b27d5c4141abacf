"""Components built from their settings alone (no Config), and the settings built from a Config:
an Updater's update is the policy loss of the whole batch however it is cut, the knobs move as
their controllers say, and every engine option is the Config field of its name, defaults in one place."""

from __future__ import annotations

import copy
import dataclasses
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo import core
from grpo.config import Config
from grpo.infra.distributed import World
from grpo.rollout import ROLLOUT_ENGINES, SamplingSettings, make_engine
from grpo.rollout.keys import row_keys
from grpo.train import settings as build
from grpo.train.batch import Batch
from grpo.train.forwards import Forwards
from grpo.train.knobs import Knobs, KnobSettings
from grpo.train.optim import Schedule
from grpo.train.update import Updater, UpdateSettings
from tests.conftest import TEST_SEED

LR = 1e-3


def _update_settings(**kw) -> UpdateSettings:
    base = dict(policy_loss="clip", loss=core.LossSettings(aggregation="token_mean"), group_size=2, num_iterations=1,
                mini_batches=1, micro_batch=2, skip_zero_advantage=False, entropy_target=False, learning_rate=LR,
                adam_betas=(0.9, 0.999), weight_decay=0.0,
                schedule=Schedule(lr_scheduler_type="constant", warmup_steps=0, max_steps=1), max_grad_norm=0.0,
                max_consecutive_skips=3)
    return UpdateSettings(**{**base, **kw})


@pytest.fixture(scope="module")
def rollout(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ro = make_engine("hf", model, tok).generate(["What is 1 + 2?", "Hi", "2 * 3 =", "Name a colour."], group_size=2,
                                                sampling=SamplingSettings(max_new_tokens=6, temperature=1.0, max_prompt_length=1024),
                                                keys=row_keys(TEST_SEED, 0, 0, 8))
    return model, ro


def test_an_updater_from_settings_alone_takes_the_whole_batchs_step(rollout):
    """UpdateSettings, no Config: micro-batches of 2 of the 8 rows, token_mean over the batch. The
    logged loss is core.policy_loss on all rows at once, and AdamW's first step moves each weight by
    lr * g / (|g| + eps) of that loss's gradient g (m and v hold one gradient, bias-corrected)."""
    model, ro = rollout
    policy, ref_model = copy.deepcopy(model), copy.deepcopy(model)
    fw = Forwards(group_size=2, share_prompt=False, attn_implementation="sdpa", autocast=False, max_tokens=0,
                  sharded=False, tied_grad_in_place=False)
    adv = torch.linspace(-0.5, 1.5, 8)[:, None].expand_as(ro.loss_mask).contiguous()  # [N, T]
    batch = Batch(ro, adv, ro.loss_mask.float(), None, None)
    knobs = SimpleNamespace(epsilon=0.2, eps_high=0.28, beta=0.0, entropy_coef=0.0, temperature=1.0)
    upd = Updater(_update_settings(), world=World(), policy=policy, module=policy, forwards=fw, critic=None,
                  checkpoint_dir=None)
    before = {k: p.detach().clone() for k, p in policy.named_parameters()}
    metrics = upd.update(batch, knobs, step=0)

    logp = fw.logprobs(ref_model, ro, torch.arange(8), temperature=1.0)["logp"]  # [N, T]
    whole = core.LossSettings(aggregation="token_mean", eps_low=0.2, eps_high=0.28, total=float(batch.mask.sum()))
    out = core.policy_loss(logp, logp.detach(), adv, batch.mask, settings=whole)
    out["loss"].backward()
    assert metrics["loss"] == pytest.approx(float(out["loss"].detach()), abs=1e-6)
    assert metrics["optimizer_steps"] == 1 and metrics["learning_rate"] == LR
    moved = 0
    for k, p in ref_model.named_parameters():
        g = p.grad
        big = g.abs() > 1e-4  # where eps = 1e-8 and summation order cannot tip the step
        step = (dict(policy.named_parameters())[k].detach() - before[k])[big]
        torch.testing.assert_close(step, -LR * torch.sign(g[big]), atol=LR * 1e-3, rtol=0, msg=k)
        moved += int(big.sum())
    assert moved > 100


def test_a_step_builds_its_loss_settings_once_from_the_knobs():
    """The run's LossSettings with this step's knob values; the KL term only where the batch keeps it."""
    upd = Updater.__new__(Updater)
    upd.settings = _update_settings(loss=core.LossSettings(kl_estimator="k2", cispo_ratio_max=3.0))
    knobs = SimpleNamespace(epsilon=0.1, eps_high=0.3, beta=0.05, entropy_coef=0.01, temperature=0.7)
    mask = torch.ones(2, 3)
    grpo = upd.loss_settings(Batch(None, mask, mask, None, None), knobs)
    assert (grpo.eps_low, grpo.eps_high, grpo.kl_coef, grpo.entropy_coef) == (0.1, 0.3, 0.05, 0.01)
    assert (grpo.kl_estimator, grpo.cispo_ratio_max) == ("k2", 3.0)  # the run's own fields kept
    ppo = upd.loss_settings(Batch(None, mask, mask, None, None, kl_in_loss=False), knobs)
    assert ppo.kl_coef == 0.0  # PPO: the KL is in the reward


def _knob_settings(**kw) -> KnobSettings:
    base = dict(epsilon=0.2, eps_high=0.28, beta=0.04, entropy_coef=0.0, temperature=1.0, clip_target_band=None,
                clip_step_band=None, clip_step_size=0.02, clip_step_patience=10, clip_epsilon_min=0.01,
                clip_epsilon_max=0.5, controller_factor=2.0, entropy_target_band=None,
                entropy_target_knob="temperature", kl_target=None, kl_adapt_rate=0.1, consistency_steps=0,
                consistency_converging=0.15, consistency_guessing=0.35, consistency_plateau=0.18, fuse_metric="",
                fuse_min=None, fuse_max=None, fuse_patience=3)
    return KnobSettings(**{**base, **kw})


def test_knobs_from_settings_alone_move_as_their_controllers_say():
    """Clip band [0.1, 0.2], factor 2: a clip fraction of 0.35 is 4 half-widths above the middle (a
    wider range clips less: epsilon grows), the exponent clamps at 2, epsilon 0.2 * 2^2 = 0.8 bounded to
    0.5; eps_high keeps its ratio 1.4. At the middle nothing moves. The fuse on kl above 1.0 blows at
    its second strike."""
    k = Knobs(_knob_settings(clip_target_band=(0.1, 0.2), fuse_metric="kl", fuse_max=1.0, fuse_patience=2))
    metrics = {"clip_fraction": 0.35, "kl": 2.0}
    first = k.after_step(metrics)
    assert first.fuse_reason is None and metrics == {"clip_fraction": 0.35, "kl": 2.0}  # its argument left as it was
    assert first.metrics["nonfinite_count"] == 0
    assert (k.epsilon, k.eps_high) == (0.5, pytest.approx(0.7))
    assert k.after_step({"clip_fraction": 0.15, "kl": 3.0}).fuse_reason.startswith("fuse: kl = 3.0 left its band")
    assert k.values() == {"epsilon": pytest.approx(0.5), "epsilon_high": pytest.approx(0.7), "beta": 0.04,
                          "entropy_coef": 0.0, "temperature": 1.0}


def test_knob_settings_from_a_config_match_its_fields():
    cfg = Config(clip_target_band=[0.1, 0.3], epsilon=0.1, epsilon_high=0.2, fuse_metric="kl", fuse_max=2.0,
                 num_iterations=2)
    s = build.knob_settings(cfg)
    assert (s.clip_target_band, s.epsilon, s.eps_high, s.fuse_metric, s.fuse_max) == ((0.1, 0.3), 0.1, 0.2, "kl", 2.0)
    k = Knobs(s)
    assert k.controllers["epsilon"].bounds == (cfg.clip_epsilon_min, cfg.clip_epsilon_max)


def test_distillation_and_judge_fields_reach_their_settings():
    """A teacher makes the batch compute the reference's (the teacher's) log-probs whatever beta is,
    distill_grpo_weight reaches the loss, and every judge setting is the judge_* field of its name."""
    cfg = Config(policy_loss="distill", teacher="some/teacher", beta=0.0, distill_grpo_weight=0.5)
    assert build.batch_settings(cfg).reference and build.loss_settings(cfg).distill_grpo_weight == 0.5
    assert not build.batch_settings(Config(beta=0.0)).reference
    cfg = Config(rewards="judge", judge_url="http://127.0.0.1:9/v1", judge_model="m", judge_api_key_env="K",
                 judge_template="{completions}", judge_score="number", judge_score_scale=10.0, judge_mode="group",
                 judge_max_tokens=3, judge_temperature=0.5)
    judge = build.reward_options(cfg).judge
    assert {f.name: getattr(judge, f.name) for f in dataclasses.fields(judge)} \
        == {f.name: getattr(cfg, f"judge_{f.name}") for f in dataclasses.fields(judge)}


@pytest.mark.parametrize("name", sorted(ROLLOUT_ENGINES))
def test_each_engine_option_is_the_config_field_of_its_name_with_its_default(name):
    """An engine's Options hold the defaults; the Config's <engine>_<option> fields repeat them, and the
    trainer builds the options from those fields."""
    options = ROLLOUT_ENGINES[name].Options
    default = Config()
    for f in dataclasses.fields(options):
        assert hasattr(default, f"{name}_{f.name}"), f"{name}: option {f.name} has no Config field {name}_{f.name}"
        assert getattr(default, f"{name}_{f.name}") == f.default, (name, f.name)
    assert build.engine_options(default, name) == options()


def test_engine_options_carry_the_configs_values_and_a_wrong_type_is_refused(tiny_model_dir):
    from grpo.rollout.vllm.client import VLLMServerOptions

    opts = build.engine_options(Config(vllm_server_port=9001, vllm_server_weight_dir="/dev/shm"), "vllm_server")
    assert opts == VLLMServerOptions(port=9001, weight_dir="/dev/shm")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert make_engine("hf", model, tok).options == ROLLOUT_ENGINES["hf"].Options()
    with pytest.raises(TypeError, match="options must be a NoOptions, not dict"):
        make_engine("hf", model, tok, options={"x": 1})


def test_a_batch_is_not_changed_after_it_is_made():
    mask = torch.ones(2, 3)
    batch = Batch(None, mask, mask, None, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        batch.advantages = 2 * mask


def test_policy_loss_takes_built_settings_or_their_fields_not_both():
    g = torch.Generator().manual_seed(TEST_SEED)
    logp, old = -torch.rand(3, 4, generator=g), -torch.rand(3, 4, generator=g)  # [N, T]
    adv, mask = torch.randn(3, 4, generator=g), torch.ones(3, 4)  # [N, T]
    s = core.LossSettings(eps_low=0.1, eps_high=0.3, aggregation="seq_mean_token_mean")
    built = core.policy_loss(logp, old, adv, mask, settings=s)
    fields = core.policy_loss(logp, old, adv, mask, eps_low=0.1, eps_high=0.3, aggregation="seq_mean_token_mean")
    assert float(built["loss"]) == float(fields["loss"])
    assert float(built["loss"]) != float(core.policy_loss(logp, old, adv, mask)["loss"])  # the settings matter
    with pytest.raises(TypeError, match="given together"):
        core.policy_loss(logp, old, adv, mask, settings=s, eps_low=0.2)


def test_the_async_engine_process_takes_every_core_in_turns_else_half_unless_told():
    """Taking turns with the trainer (async_turns, on the CPU on one process) the engine process samples
    on every core; computing beside a trainer on every core it would oversubscribe the machine, so it
    takes half the trainer's threads (at least one); async_engine_threads overrides either."""
    def threads(cores: int, *, cpu_alone: bool = True, **kw) -> int:
        cfg = Config(async_rollouts=True, **kw)
        return build.run_settings(cfg, cores=cores, cpu_alone=cpu_alone).engine.process.threads

    assert [threads(c) for c in (1, 2, 3, 16)] == [1, 2, 3, 16]
    assert [threads(c, cpu_alone=False) for c in (1, 2, 3, 16)] == [1, 1, 1, 8]  # a GPU, torchrun
    assert [threads(c, async_turns=False) for c in (1, 2, 3, 16)] == [1, 1, 1, 8]
    assert threads(16, async_engine_threads=3) == threads(16, cpu_alone=False, async_engine_threads=3) == 3
    assert build.run_settings(Config(async_rollouts=True), cores=2).asynchronous.turns
    assert not build.run_settings(Config(async_rollouts=True), cores=2, cpu_alone=False).asynchronous.turns
    assert build.engine_process_settings(Config(), 16, turns=False) is None
