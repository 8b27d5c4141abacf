"""The trainer end to end on a tiny random Llama: every estimator and aggregation, mu = 2, failures."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo.config import Config
from grpo.core import AGGREGATIONS, ESTIMATORS
from grpo.eval.evaluate import EvalSettings, evaluate
from grpo.infra.logger import NullLogger
from grpo.rollout import SamplingSettings, make_engine
from grpo.train.trainer import Trainer
from tests.conftest import TEST_BF16, TEST_SEED, first_seed


def make_cfg(tmp_path, model_dir, dataset, **kw) -> Config:
    base = dict(model=str(model_dir), task=str(dataset), output_dir=str(tmp_path / "run"), max_steps=3,
                num_generations=4, prompts_per_step=2, per_device_train_batch_size=4, max_completion_length=8,
                eval_prompts=4, eval_max_new_tokens=6, eval_pass_k=2, eval_pass_prompts=2,
                rewards="tests.rewards_for_tests:digit_share", learning_rate=1e-2, temperature=1.0,
                progress=False, report_to="none", log_completions_steps=1, seed=TEST_SEED, reward_timeout=0.0,
                bf16=TEST_BF16)
    base.update(kw)
    return Config(**base)


def draw_seed(tmp_path, model_dir, dataset, holds, what: str, **kw) -> int:
    """A seed (from GRPO_TEST_SEED on) whose step-1 rewards [B, G] satisfy ``holds``."""
    def check(seed: int) -> bool:
        t = Trainer(make_cfg(tmp_path / f"probe{seed}", model_dir, dataset, **{**kw, "seed": seed}))
        samples, ro = t.collector.sample(step=t.step, temperature=t.knobs.temperature)
        rewards, _ = t.collector.score(samples, ro, step=t.step)  # [B, G]
        return bool(holds(rewards))

    return first_seed(check, what)


def signal_seed(tmp_path, model_dir, dataset, **kw) -> int:
    """A seed whose step-1 draw has reward signal: a group whose rewards are not all equal, so the
    first update moves the policy (a check that needs movement needs this)."""
    return draw_seed(tmp_path, model_dir, dataset, lambda r: (r.std(1) > 0).any(), "reward signal at step 1", **kw)


def _params(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _run(cfg):
    t = Trainer(cfg)
    before = _params(t.policy)
    result = t.train()
    return t, before, result


def _lines(run_dir):
    return [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
def test_three_steps_every_estimator(tmp_path, tiny_model_dir, tiny_dataset, estimator):
    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, advantage_estimator=estimator, eval_prompts=0)
    t, before, _ = _run(cfg)
    after = _params(t.policy)
    assert any(not torch.equal(before[k], after[k]) for k in before), "no parameter changed"
    lines = _lines(t.run_dir)
    assert [l["step"] for l in lines] == [1, 2, 3]
    for line in lines:
        for key in ("loss", "kl", "reward_mean", "grad_norm", "entropy", "clip_fraction", "zero_variance_share",
                    "advantage_variance", "completion_length_mean", "step_seconds", "tokens_per_second"):
            assert line[key] is not None and math.isfinite(line[key]), (key, line)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_three_steps_every_aggregation_and_checkpoint_reloads(tmp_path, tiny_model_dir, tiny_dataset, aggregation):
    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, aggregation=aggregation)
    t, before, result = _run(cfg)
    ckpt = t.run_dir / "checkpoints" / "step-3"
    assert (t.run_dir / "checkpoints" / "latest").read_text().strip() == "step-3"
    reloaded = AutoModelForCausalLM.from_pretrained(ckpt)
    for k, v in reloaded.state_dict().items():
        torch.testing.assert_close(v, t.policy.state_dict()[k])
    ev = json.loads((t.run_dir / "eval.json").read_text())
    assert set(ev) >= {"before", "after", "n_prompts"} and ev["n_prompts"] == 4
    # "after" is the checkpoint's greedy evaluation: the reloaded weights give the same answers
    again = evaluate(make_engine("hf", reloaded, t.tok), t.task.eval, t.rewards.fns[cfg.reward_names[0]],
                     EvalSettings(system_prompt=cfg.system_prompt, batch_size=64, pass_k=0, pass_prompts=0,
                                  verifier_name=cfg.reward_names[0],
                                  sampling=SamplingSettings(max_new_tokens=cfg.eval_max_new_tokens, temperature=1.0,
                                                            max_prompt_length=1024)))
    assert (again["accuracy"], again["mean_length"]) == (ev["after"]["accuracy"], ev["after"]["mean_length"])
    assert ev["after"]["k"] == 2 and ev["after"]["pass@k"] in (0.0, 0.5, 1.0)  # 2 prompts, n = k = 2
    assert (t.run_dir / "config.yaml").is_file() and (t.run_dir / "samples.jsonl").is_file()


def test_mu_two_second_pass_moves_ratio_and_clips(tmp_path, tiny_model_dir, tiny_dataset):
    kw = dict(num_iterations=2, learning_rate=0.5, eval_prompts=0, max_grad_norm=0.0, epsilon=0.05, beta=0.0)
    seed = signal_seed(tmp_path, tiny_model_dir, tiny_dataset, **kw)
    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, seed=seed, **kw)
    t = Trainer(cfg)
    t.logger = _Quiet()
    metrics = t.train_step()
    # the clip fraction is averaged over both passes; the first has ratio exactly 1, so any clipping
    # and any ratio away from 1 come from the second pass, after the first update moved the policy
    assert metrics["clip_fraction"] > 0
    assert metrics["ratio_mean"] != pytest.approx(1.0, abs=1e-6)


def test_reward_that_always_raises_is_counted_not_fatal(tmp_path, tiny_model_dir, tiny_dataset, capsys):
    """faults.md row 23: every sample's reward is NaN, counted per step and in total, the failure is
    logged once (not once per sample or step) with the completion and answer it failed on, and no
    sample reaches the loss; with max_reward_failure_share above 1 (never stop; by default such a run
    stops at its first step: tests/test_trainer_rewards.py) the run goes on to its last step."""
    name = "tests.rewards_for_tests:always_raises"
    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, rewards=name, eval_prompts=0, max_reward_failure_share=2.0)
    capsys.readouterr()
    t, before, _ = _run(cfg)
    lines = _lines(t.run_dir)
    assert len(lines) == 3
    assert [l["reward_failures"] for l in lines] == [8, 8, 8]
    assert lines[-1]["reward_failures_total"] == 24
    after = _params(t.policy)  # every sample left the loss: no update moved the weights
    assert all(torch.equal(before[k], after[k]) for k in before)
    samples = [json.loads(l) for l in (t.run_dir / "samples.jsonl").read_text().splitlines()]
    assert samples and all(math.isnan(r["reward"]) for r in samples)
    reports = [l for l in capsys.readouterr().out.splitlines() if "this reward is broken on purpose" in l]
    first = samples[0]  # step 1's first completion: the first to fail
    assert reports == [f"reward {name!r} failed (RuntimeError: this reward is broken on purpose) on completion "
                       f"{first['completion'][:200]!r} with answer {first['answer']!r}; such failures are counted "
                       f"in metrics as reward_failures and the samples left out of the loss"]


def test_bad_reward_values_become_failures(tmp_path, tiny_model_dir, tiny_dataset):
    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, rewards="tests.rewards_for_tests:sometimes_bad",
                   eval_prompts=0, max_steps=2)
    t, _, _ = _run(cfg)
    lines = _lines(t.run_dir)
    # 3 of every 4 calls return None (the only reward: nothing scores the row), NaN or inf
    assert sum(l["reward_failures"] for l in lines) >= 10
    assert all(math.isfinite(l["loss"]) for l in lines)


def test_same_seed_same_rewards(tmp_path, tiny_model_dir, tiny_dataset):
    a = make_cfg(tmp_path / "a", tiny_model_dir, tiny_dataset, eval_prompts=0)
    b = make_cfg(tmp_path / "b", tiny_model_dir, tiny_dataset, eval_prompts=0)
    ta, _, _ = _run(a)
    tb, _, _ = _run(b)
    keys = ("reward_mean", "loss", "grad_norm", "completion_length_mean")
    assert [[l[k] for k in keys] for l in _lines(ta.run_dir)] == [[l[k] for k in keys] for l in _lines(tb.run_dir)]


def test_both_precisions_give_the_same_update_to_bf16_rounding(tmp_path, tiny_model_dir, tiny_dataset):
    """The suite pins bf16=False so it does not depend on the CPU's native bf16; bf16=True must work on
    any CPU too: the same draw and rewards, a gradient that autocast changed by bf16 rounding
    (measured: a relative error of about 2e-3) and no more."""
    seed = signal_seed(tmp_path, tiny_model_dir, tiny_dataset, eval_prompts=0)  # a non-zero gradient to compare
    fp32, bf16 = (_one_update(make_cfg(tmp_path / str(b), tiny_model_dir, tiny_dataset, eval_prompts=0, seed=seed,
                                       bf16=b)) for b in (False, True))
    assert torch.equal(fp32["rewards"], bf16["rewards"])
    assert fp32["grads"].keys() == bf16["grads"].keys() and fp32["grads"]
    a = torch.cat([g.flatten() for g in fp32["grads"].values()])
    b = torch.cat([bf16["grads"][k].flatten() for k in fp32["grads"]])
    rel = float((b - a).norm() / a.norm())
    assert 1e-5 < rel < 0.1, rel  # above: autocast ran; below: it is the same update


@pytest.mark.parametrize("use_peft", [False, True])
def test_fast_rollout_backend_trains_the_same_trajectory(tmp_path, tiny_model_dir, tiny_dataset, use_peft, monkeypatch):
    """rollout_engine=fast samples the same tokens as hf for the same keys, so three steps (the policy
    moving in between) log the same rewards, lengths and losses; the metric names the backend that ran
    (auto resolves to fast for a Llama where fast's step measured faster, also under LoRA). Nothing
    here is timed: the speed probe's two measurements are given (fast the faster) and the kernels
    pinned, so the result does not depend on the machine's load (test_rollout_tuning times them)."""
    from grpo.infra.process_cache import ProcessCache
    from grpo.rollout import choice, tuning

    monkeypatch.setenv("GRPO_CACHE", str(tmp_path / "cache"))  # no decision cached by an earlier test
    monkeypatch.setattr(tuning, "MEASURED", ProcessCache("this test's choices", stale_when="the test ends"))
    monkeypatch.setattr(choice, "fast_step_seconds", lambda *a, **k: 0.001)
    monkeypatch.setattr(choice, "hf_step_seconds", lambda *a, **k: 0.002)
    kw = dict(eval_prompts=0, use_peft=use_peft, lora_r=4, decode_kernels="mkl")
    a = make_cfg(tmp_path / "a", tiny_model_dir, tiny_dataset, rollout_engine="hf", **kw)
    b = make_cfg(tmp_path / "b", tiny_model_dir, tiny_dataset, rollout_engine="auto", **kw)
    ta, _, _ = _run(a)
    tb, _, _ = _run(b)
    keys = ("reward_mean", "completion_length_mean", "loss")
    la, lb = _lines(ta.run_dir), _lines(tb.run_dir)
    assert [l[k] for l in la for k in keys] == pytest.approx([l[k] for l in lb for k in keys], abs=1e-6)
    assert len(la) == 3 and any(l["loss"] != 0 for l in la)  # the policy moved between the steps
    assert {l["rollout_engine"] for l in la} == {"hf"} and {l["rollout_engine"] for l in lb} == {"fast"}


def test_a_trainer_trains_again_after_train(tmp_path, tiny_model_dir, tiny_dataset):
    """train() releases its rollout engines at the end; a second train() with a higher max_steps
    opens them again and continues from the step the first one reached, and so does sampling."""
    t = Trainer(make_cfg(tmp_path, tiny_model_dir, tiny_dataset, eval_prompts=0, max_steps=1))
    t.train()
    first = t.engines.opened()
    assert first and all(e.closed for e in first)
    t.cfg.max_steps = 2
    t.train()
    second = t.engines.opened()
    assert t.step == 2 and all(e.closed for e in second) and not {id(e) for e in first} & {id(e) for e in second}
    steps = [json.loads(l)["step"] for l in (t.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    samples, ro = t.collector.sample(step=t.step, temperature=t.knobs.temperature)  # sampling after train() opens the engines too
    assert len(ro.texts) == len(samples) * t.cfg.num_generations and not t.engines.opened()[0].closed


def test_lora_reference_is_base_model(tmp_path, tiny_model_dir, tiny_dataset):
    kw = dict(use_peft=True, lora_r=4, beta=0.1, eval_prompts=0, learning_rate=5e-2)
    seed = signal_seed(tmp_path, tiny_model_dir, tiny_dataset, **kw)
    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, seed=seed, **kw)
    t, before, _ = _run(cfg)
    assert t.models.reference is None  # no second copy in memory
    trainable = [k for k, p in t.policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in k for k in trainable)
    after = _params(t.policy)
    assert any(not torch.equal(before[k], after[k]) for k in trainable)
    assert all(torch.equal(before[k], after[k]) for k in before if "lora_" not in k)
    assert _lines(t.run_dir)[-1]["kl"] > 0  # the adapted policy has moved away from the base


def test_reference_reset_makes_kl_zero(tmp_path, tiny_model_dir, tiny_dataset):
    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, beta=0.1, ref_reset_steps=2, eval_prompts=0,
                   max_steps=3, learning_rate=5e-2)
    t, _, _ = _run(cfg)
    kl = [l["kl"] for l in _lines(t.run_dir)]
    assert kl[0] == pytest.approx(0.0, abs=1e-6)  # step 1: reference == policy
    assert kl[1] > 1e-6  # step 2: policy moved
    assert kl[2] == pytest.approx(0.0, abs=1e-6)  # step 3: reference reset to the policy


class _Quiet:
    def note(self, *_):
        pass

    def log_samples(self, *_):
        pass


@pytest.mark.parametrize("mini_batches", [1, 2])  # 2: policy and critic step on each half of the groups
def test_ppo_three_steps_policy_and_critic_change(tmp_path, tiny_model_dir, tiny_dataset, mini_batches):
    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, advantage_estimator="gae", beta=0.05, eval_prompts=0,
                   critic_learning_rate=1e-2, mini_batches=mini_batches)
    t = Trainer(cfg)
    before = _params(t.policy)
    v_before = {k: v.detach().clone() for k, v in t.critic.model.named_parameters()}
    t.train()
    assert any(not torch.equal(before[k], v) for k, v in _params(t.policy).items())
    assert any(not torch.equal(v_before[k], v) for k, v in t.critic.model.named_parameters())
    lines = _lines(t.run_dir)
    assert len(lines) == 3
    for line in lines:
        for key in ("value_loss", "explained_variance", "value_mean", "critic_divergence_events", "kl"):
            assert line[key] is not None and math.isfinite(line[key]), key


@pytest.mark.parametrize("estimator", ["rloo", "reinforce", "mean_baseline"])
def test_baselines_log_the_same_metrics_as_grpo(tmp_path, tiny_model_dir, tiny_dataset, estimator):
    grpo_run = Trainer(make_cfg(tmp_path / "g", tiny_model_dir, tiny_dataset, eval_prompts=0, max_steps=1))
    grpo_run.train()
    other = Trainer(make_cfg(tmp_path / "o", tiny_model_dir, tiny_dataset, eval_prompts=0, max_steps=1,
                             advantage_estimator=estimator))
    other.train()
    assert set(_lines(grpo_run.run_dir)[0]) == set(_lines(other.run_dir)[0])


def test_reward_that_hangs_is_cut_at_its_deadline(tmp_path, tiny_model_dir, tiny_dataset):
    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, rewards="tests.rewards_for_tests:hangs_every_third",
                   reward_timeout=2.0, eval_prompts=0, max_steps=2)  # ample for the calls that return
    t, _, _ = _run(cfg)
    lines = _lines(t.run_dir)
    assert len(lines) == 2 and lines[-1]["reward_timeouts_total"] >= 2
    assert all(l["reward_failures"] >= 1 for l in lines) and all(math.isfinite(l["loss"]) for l in lines)


def test_ppo_shared_trunk_trains_head_and_body(tmp_path, tiny_model_dir, tiny_dataset):
    kw = dict(advantage_estimator="gae", beta=0.05, eval_prompts=0, critic_learning_rate=1e-2,
              critic_shared_trunk=True)
    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, vf_coef=0.5, **kw)
    t = Trainer(cfg)
    assert t.critic.model is t.policy  # no second model in memory
    head_before = t.critic.head.weight.detach().clone()
    t.train()
    assert not torch.equal(head_before, t.critic.head.weight)
    line = _lines(t.run_dir)[-1]
    assert math.isfinite(line["value_loss"]) and math.isfinite(line["explained_variance"])
    # the value loss reaches the body: the same draw with another vf_coef (only the value term's
    # weight changed) gives the trunk another gradient. The head starts at zero, which passes no
    # gradient back; here it starts from the same random values in both runs
    def random_head(trainer, _batch):
        with torch.no_grad():
            trainer.critic.head.weight.copy_(torch.randn(trainer.critic.head.weight.shape,
                                                         generator=torch.Generator().manual_seed(1)))

    grads = [_one_update(make_cfg(tmp_path / f"vf{c}", tiny_model_dir, tiny_dataset, vf_coef=c, **kw),
                         before_update=random_head)["grads"] for c in (0.5, 2.0)]
    assert grads[0].keys() == grads[1].keys()
    trunk = [k for k in grads[0] if "layers." in k]
    assert trunk and any(not torch.allclose(grads[0][k], grads[1][k], atol=1e-7, rtol=1e-4) for k in trunk)


def _one_update(cfg, *, perturb_reference: bool = False, before_update=None) -> dict:
    """Sample, score, prepare and update once; returns the update's metrics, the rewards [B, G], the
    summed gradient each parameter had at the (last) optimizer step, those of every optimizer step, the
    batch and the scheduler's step count. ``before_update(trainer, batch)`` runs just before the update."""
    t = Trainer(cfg)
    t.logger = NullLogger()
    if perturb_reference:  # a reference unlike the policy, so the KL term has a gradient at step 1
        g = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for p in t.models.reference.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g).to(p.device))
    grads, grad_steps = {}, []
    step = t.updater._optimizer_step

    def capture(at):
        grad_steps.append({n: p.grad.clone() for n, p in t.policy.named_parameters() if p.grad is not None})
        grads.update(grad_steps[-1])
        return step(at)

    t.updater._optimizer_step = capture
    samples, ro = t.collector.sample(step=t.step, temperature=t.knobs.temperature)
    rewards, _ = t.collector.score(samples, ro, step=t.step)
    batch, _ = t.prepare(ro, rewards)
    if before_update is not None:
        before_update(t, batch)
    metrics = t.update(batch)
    return {"metrics": metrics, "rewards": rewards, "grads": grads, "grad_steps": grad_steps, "batch": batch,
            "schedule_steps": t.updater.scheduler.last_epoch}


def _assert_same_grads(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and a
    for name, g in a.items():
        torch.testing.assert_close(b[name], g, atol=1e-5 * max(1.0, float(g.abs().max())), rtol=0, msg=name)


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean"])
def test_zero_advantage_sequences_skip_the_backward_with_the_same_update(tmp_path, tiny_model_dir, tiny_dataset,
                                                                         aggregation):
    """beta = 0, mu = 1: sequences whose advantage is 0 have no gradient, so leaving them out of the
    forward and backward pass gives the same loss and the same gradient."""
    kw = dict(eval_prompts=0, beta=0.0, rewards="tests.rewards_for_tests:has_digit", aggregation=aggregation, bf16=False,
              prompts_per_step=4, per_device_train_batch_size=8)
    updates = {}

    def both_kinds(seed: int) -> bool:  # the check needs zero-variance and mixed groups in one draw
        updates[seed] = _one_update(make_cfg(tmp_path / f"a{seed}", tiny_model_dir, tiny_dataset,
                                             skip_zero_advantage=False, seed=seed, **kw))
        r = updates[seed]["rewards"]
        return 0 < (r.std(1) == 0).sum().item() < r.shape[0]

    seed = first_seed(both_kinds, "both zero-variance and mixed groups at step 1")
    full = updates[seed]
    skip = _one_update(make_cfg(tmp_path / "b", tiny_model_dir, tiny_dataset, skip_zero_advantage=True, seed=seed,
                                **kw))
    assert full["metrics"]["trained_sequence_share"] == 1 and skip["metrics"]["trained_sequence_share"] < 1
    assert skip["metrics"]["loss"] == pytest.approx(full["metrics"]["loss"], abs=1e-6)
    _assert_same_grads(full["grads"], skip["grads"])


def test_shared_prefix_gives_the_same_update(tmp_path, tiny_model_dir, tiny_dataset):
    """Shared-prefix training changes how the forwards are laid out, not what they compute: the same
    batch gives the same loss, KL (against a reference unlike the policy) and gradient."""
    kw = dict(eval_prompts=0, beta=0.1, per_device_train_batch_size=8, bf16=False)  # fp32: exact up to rounding
    a = _one_update(make_cfg(tmp_path / "a", tiny_model_dir, tiny_dataset, shared_prefix=False, **kw),
                    perturb_reference=True)
    b = _one_update(make_cfg(tmp_path / "b", tiny_model_dir, tiny_dataset, shared_prefix=True, **kw),
                    perturb_reference=True)
    assert a["metrics"]["kl"] > 0.01
    for key in ("loss", "kl", "entropy", "policy_loss"):
        assert b["metrics"][key] == pytest.approx(a["metrics"][key], rel=1e-5, abs=1e-7), key
    _assert_same_grads(a["grads"], b["grads"])


@pytest.mark.parametrize("shared_prefix, use_peft", [(True, False), (False, False), (True, True)])
def test_gradient_checkpointing_gives_the_same_update(tmp_path, tiny_model_dir, tiny_dataset, shared_prefix, use_peft):
    """Recomputing each decoder layer in the backward pass changes memory, not the update: the same
    loss, KL and gradient (shared prefix: the recompute must attend through the grouped attention
    too), and the layers did run twice."""
    kw = dict(eval_prompts=0, beta=0.1, per_device_train_batch_size=8, bf16=False, shared_prefix=shared_prefix,
              use_peft=use_peft)
    runs = {}
    for on in (False, True):
        calls = []

        def count_mlp_calls(t, _batch):
            base = t.policy.get_base_model() if use_peft else t.policy
            base.model.layers[0].mlp.register_forward_pre_hook(lambda *_: calls.append(1))

        runs[on] = _one_update(make_cfg(tmp_path / str(on), tiny_model_dir, tiny_dataset, gradient_checkpointing=on,
                                        **kw), perturb_reference=not use_peft, before_update=count_mlp_calls)
        runs[on]["mlp_calls"] = len(calls)
    assert runs[True]["mlp_calls"] == 2 * runs[False]["mlp_calls"] > 0  # forward, then the recompute
    for key in ("loss", "kl", "entropy", "policy_loss"):
        assert runs[True]["metrics"][key] == pytest.approx(runs[False]["metrics"][key], rel=1e-5, abs=1e-7), key
    _assert_same_grads(runs[False]["grads"], runs[True]["grads"])


def test_mini_batches_split_the_batch_gradient(tmp_path, tiny_model_dir, tiny_dataset):
    """mini_batches=2 takes two optimizer steps per pass, each on the token-mean loss of its own groups
    (group j in mini-batch j mod 2). At learning rate 0 the weights stay put, so the two gradients,
    weighted by their mini-batches' token counts, add up to the whole batch's gradient times its count."""
    kw = dict(eval_prompts=0, beta=0.1, aggregation="token_mean", learning_rate=0.0, per_device_train_batch_size=4,
              prompts_per_step=4, num_generations=2, bf16=False)
    full = _one_update(make_cfg(tmp_path / "a", tiny_model_dir, tiny_dataset, **kw), perturb_reference=True)
    split = _one_update(make_cfg(tmp_path / "b", tiny_model_dir, tiny_dataset, mini_batches=2, **kw),
                        perturb_reference=True)
    assert len(full["grad_steps"]) == 1 and len(split["grad_steps"]) == 2
    assert split["batch"].old_logp is not None  # the policy may have moved before the second mini-batch
    mask = full["batch"].mask  # [8, T], rows: groups (0, 1), (2, 3), (4, 5), (6, 7)
    tokens = [float(mask[rows].sum()) for rows in ([0, 1, 4, 5], [2, 3, 6, 7])]  # groups 0, 2 and 1, 3
    combined = {k: (split["grad_steps"][0][k] * tokens[0] + split["grad_steps"][1][k] * tokens[1]) / sum(tokens)
                for k in full["grads"]}
    _assert_same_grads(full["grads"], combined)
    assert split["metrics"]["kl"] == pytest.approx(full["metrics"]["kl"], rel=1e-5)  # token-weighted over both


def test_a_mini_batch_without_counted_tokens_takes_no_step(tmp_path, tiny_model_dir, tiny_dataset):
    """token_mean, 2 mini-batches, every token of the second (groups 1 and 3) masked out, as when their
    rewards failed: it has no loss (0 / 0 before), so only the first takes an optimizer step, the
    update stays finite and the schedule still moves two steps per pass."""
    def mask_second_mini_batch(t, batch):
        batch.mask[[2, 3, 6, 7]] = 0  # 4 groups of 2 rows; groups 1 and 3 form mini-batch 2

    kw = dict(eval_prompts=0, beta=0.1, aggregation="token_mean", per_device_train_batch_size=4, prompts_per_step=4,
              num_generations=2, bf16=False, mini_batches=2, num_iterations=2)
    run = _one_update(make_cfg(tmp_path, tiny_model_dir, tiny_dataset, **kw), before_update=mask_second_mini_batch)
    m = run["metrics"]
    assert m["optimizer_steps"] == 2 and len(run["grad_steps"]) == 2  # one per pass
    assert run["schedule_steps"] == 4
    assert math.isfinite(m["loss"]) and m["skipped_updates"] == 0 and math.isfinite(m["grad_norm"])


def test_token_budget_splits_passes_with_the_same_update(tmp_path, tiny_model_dir, tiny_dataset, monkeypatch):
    """max_tokens_per_forward cuts a micro-batch into several forward/backward passes (here groups are
    split, each part with its own copy of the prompt): the loss and the gradient stay the same."""
    kw = dict(eval_prompts=0, beta=0.1, per_device_train_batch_size=8, bf16=False, max_completion_length=8)
    calls = []
    from grpo.train.update import Updater

    own = Updater._micro_loss
    monkeypatch.setattr(Updater, "_micro_loss", lambda self, batch, idx, total, knobs, **kw: calls.append(len(idx))
                        or own(self, batch, idx, total, knobs))
    one = _one_update(make_cfg(tmp_path / "a", tiny_model_dir, tiny_dataset, max_tokens_per_forward=0, **kw),
                      perturb_reference=True)
    assert calls == [8]  # one pass per micro-batch of 8 rows (2 prompts x 4)
    calls.clear()
    cut = _one_update(make_cfg(tmp_path / "b", tiny_model_dir, tiny_dataset, max_tokens_per_forward=40, **kw),
                      perturb_reference=True)
    assert len(calls) > 2 and sum(calls) == 8, calls  # more passes than groups: groups were split
    for key in ("loss", "kl", "entropy"):
        assert cut["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-5, abs=1e-7), key
    _assert_same_grads(one["grads"], cut["grads"])


def _layer_calls(model) -> list:
    """A list that grows by one each time ``model``'s first decoder layer runs (any forward of it)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    calls: list = []
    base.model.layers[0].register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize("use_peft", [False, True])
def test_beta_zero_and_mu_one_run_no_frozen_forward(tmp_path, tiny_model_dir, tiny_dataset, use_peft):
    """docs/guides/runs.md: with beta = 0 no reference is loaded or run, and with mu = 1 and one mini-batch the old
    log-probs are the detached current ones (no extra forward). Preparing the batch then runs no forward
    at all; each of beta > 0 and mu = 2 adds one (the controls: the count does see those forwards).
    Under LoRA the reference is the policy with its adapters off, so its forward shows on the policy."""
    def prepare_forwards(beta: float, mu: int) -> dict:
        t = Trainer(make_cfg(tmp_path / f"b{beta}mu{mu}", tiny_model_dir, tiny_dataset, eval_prompts=0, beta=beta,
                             num_iterations=mu, use_peft=use_peft, lora_r=4))
        t.logger = NullLogger()
        samples, ro = t.collector.sample(step=t.step, temperature=t.knobs.temperature)
        rewards, _ = t.collector.score(samples, ro, step=t.step)
        policy = _layer_calls(t.policy)
        reference = _layer_calls(t.models.reference) if t.models.reference is not None else []
        batch, _ = t.prepare(ro, rewards)
        return {"policy": len(policy), "reference": len(reference), "loaded": t.models.reference is not None,
                "old": batch.old_logp is not None, "ref": batch.ref_logp is not None}

    plain = prepare_forwards(0.0, 1)
    assert plain == {"policy": 0, "reference": 0, "loaded": False, "old": False, "ref": False}
    with_kl = prepare_forwards(0.1, 1)
    assert with_kl["ref"] and not with_kl["old"]
    if use_peft:  # no second copy: the base model's forward is the policy's, adapters disabled
        assert not with_kl["loaded"] and with_kl["policy"] > 0
    else:
        assert with_kl["loaded"] and with_kl["reference"] > 0 and with_kl["policy"] == 0
    two_passes = prepare_forwards(0.0, 2)
    assert two_passes["old"] and two_passes["policy"] > 0 and not two_passes["loaded"] and two_passes["reference"] == 0


@pytest.mark.parametrize("max_grad_norm", [1e-3, 0.0])
def test_gradient_clipping_bounds_the_applied_gradient(tmp_path, tiny_model_dir, tiny_dataset, max_grad_norm):
    """max_grad_norm clips the update's gradient by its global norm: at optimizer.step the gradient's
    norm is min(norm, max_grad_norm), where norm (the logged grad_norm) is the norm before clipping;
    0 turns clipping off, so the applied gradient is the unclipped one. A KL term against a perturbed
    reference gives every draw a gradient (no seed luck)."""
    applied = []

    def watch_step(t, _batch):
        def pre_hook(opt, *_):
            grads = [p.grad for group in opt.param_groups for p in group["params"] if p.grad is not None]
            applied.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))

        t.updater.optimizer.register_step_pre_hook(pre_hook)

    run = _one_update(make_cfg(tmp_path, tiny_model_dir, tiny_dataset, eval_prompts=0, beta=0.1,
                               max_grad_norm=max_grad_norm), perturb_reference=True, before_update=watch_step)
    norm = run["metrics"]["grad_norm"]
    assert len(applied) == 1 and norm > 1e-2  # well above the clip level of the first case
    want = min(norm, max_grad_norm) if max_grad_norm > 0 else norm
    assert applied[0] == pytest.approx(want, rel=1e-4)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_dtypes_train_on_the_cpu(tmp_path, tiny_model_dir, tiny_dataset, dtype):
    """dtype=bfloat16 and dtype=float16 load the weights in that dtype and take a step on the CPU: the
    loss and gradient norm are finite and the update was applied (skipped_updates stays 0)."""
    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, eval_prompts=0, dtype=dtype, beta=0.1, max_steps=1,
                   skip_zero_advantage=False)
    t = Trainer(cfg)
    t.logger = NullLogger()
    assert t.policy.model.layers[0].mlp.up_proj.weight.dtype == getattr(torch, dtype)
    m = t.train_step()
    assert math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) and m["skipped_updates"] == 0


def test_samples_jsonl_holds_scored_completions_at_its_cadence(tmp_path, tiny_model_dir, tiny_dataset):
    """log_completions_steps=2 over 5 steps writes samples for steps 2 and 4, and the first and last
    steps whatever the interval: G / 2 completions of each prompt, each row with the prompt, its answer
    from the task, the completion and the reward that completion got (the reward function, called
    again, gives the same value)."""
    from tests.rewards_for_tests import digit_share

    t, _, _ = _run(make_cfg(tmp_path, tiny_model_dir, tiny_dataset, eval_prompts=0, log_completions_steps=2,
                            max_steps=5, max_completion_length=4))
    rows = [json.loads(l) for l in (t.run_dir / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] * 4 + [2] * 4 + [4] * 4 + [5] * 4  # 2 prompts x (4 / 2) completions
    answers = {json.loads(l)["prompt"]: json.loads(l)["answer"] for l in tiny_dataset.read_text().splitlines()}
    for r in rows:
        assert set(r) == {"step", "prompt", "completion", "answer", "reward"}
        assert answers[r["prompt"]] == r["answer"]
        assert r["reward"] == pytest.approx(digit_share(r["completion"], r))
    assert len({r["prompt"] for r in rows if r["step"] == 2}) == 2
    none = make_cfg(tmp_path / "off", tiny_model_dir, tiny_dataset, eval_prompts=0, log_completions_steps=0,
                    max_steps=1)
    t_off, _, _ = _run(none)
    path = t_off.run_dir / "samples.jsonl"
    assert not path.exists() or path.read_text() == ""
