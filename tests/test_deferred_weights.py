"""Importance weights that read the trainer's log-probs (the engine mismatch correction, the stale-token
correction of asynchronous rollouts) are computed in the update's own forward when a step takes one
optimizer step: the update then equals the one whose weights came from a separate inference forward
over the whole batch before it (to fp32 rounding), and that forward is not run."""

from dataclasses import replace

import pytest
import torch

from grpo.train.batch import apply_logp_weight


def _state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("level, skip", [("token", False), ("sequence", False), ("token", True)])
def test_weights_from_the_update_forward_equal_a_separate_forward(tmp_path, tiny_model_dir, tiny_dataset, level, skip):
    """Every sequence trained (skip_zero_advantage off): the same update and the same metrics; with
    it on, the update trains only groups with a reward signal, and its weights still equal those of
    the separate forward (the metrics then cover the sequences it trained)."""
    from grpo.train.trainer import Trainer
    from tests.test_trainer import make_cfg

    t = Trainer(make_cfg(tmp_path, tiny_model_dir, tiny_dataset, max_steps=1, eval_prompts=0, learning_rate=1e-4,
                         skip_zero_advantage=skip, rollout_correction="truncate", rollout_correction_level=level,
                         rollout_correction_low=0.9, rollout_correction_high=1.1))
    samples, ro = t.collector.sample(step=t.step, temperature=t.knobs.temperature)
    # an engine whose log-probs differ from the trainer's, so that the weights differ from 1 and some clamp
    noise = 0.05 * torch.randn(ro.sampling_logp.shape, generator=torch.Generator().manual_seed(0))  # [N, T]
    ro = replace(ro, sampling_logp=ro.sampling_logp + noise * ro.completion_mask)
    rewards, _ = t.collector.score(samples, ro, step=t.step)
    batch, metrics = t.prepare(ro, rewards, samples)
    assert len(batch.deferred) == 1 and batch.old_logp is None
    assert "rollout_is_weight_mean" not in metrics, "the weight was computed before the update"
    plain = replace(batch, deferred=())
    now, now_metrics = apply_logp_weight(plain, batch.deferred[0], t.batches.old_logps(ro, t.knobs.temperature)["logp"])
    assert not torch.allclose(now.advantages, plain.advantages), "the weights are all 1: nothing is checked"
    assert now_metrics["rollout_is_clipped_share"] > 0

    start, opt = _state(t.policy), t.updater.optimizer.state_dict()
    got = {}
    for name, b in (("deferred", batch), ("separate", now), ("unweighted", plain)):
        t.policy.load_state_dict(start)
        t.updater.optimizer.load_state_dict(opt)
        m = t.updater.update(b, t.knobs, step=0)
        got[name] = (m, _state(t.policy))
    moved = max(float((got["separate"][1][k] - start[k]).abs().max()) for k in start)
    diff = max(float((got["deferred"][1][k] - got["separate"][1][k]).abs().max()) for k in start)
    off = max(float((got["unweighted"][1][k] - got["separate"][1][k]).abs().max()) for k in start)
    assert moved > 0 and off > 100 * diff, (moved, off, diff)
    assert diff <= 1e-3 * moved
    trained = got["deferred"][0]["rollout_is_sequences"]
    assert trained == got["deferred"][0]["trained_sequence_share"] * now.advantages.shape[0]
    if not skip:  # every sequence trained: the same rows as the separate forward
        for key, value in now_metrics.items():
            assert got["deferred"][0][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def test_a_deferred_weight_with_several_optimizer_steps_is_refused(tmp_path, tiny_model_dir, tiny_dataset):
    """With mu > 1 the update's forward is no longer the sampling policy's after the first optimizer
    step; such a batch carries the old log-probs and must not reach the update with a deferred weight."""
    from grpo.train.trainer import Trainer
    from tests.test_trainer import make_cfg

    t = Trainer(make_cfg(tmp_path, tiny_model_dir, tiny_dataset, max_steps=1, eval_prompts=0, num_iterations=2,
                         rollout_correction="truncate"))
    samples, ro = t.collector.sample(step=t.step, temperature=t.knobs.temperature)
    rewards, _ = t.collector.score(samples, ro, step=t.step)
    batch, metrics = t.prepare(ro, rewards, samples)
    assert batch.old_logp is not None and not batch.deferred and "rollout_is_weight_mean" in metrics
    weight = t.batches.correction(batch)
    with pytest.raises(ValueError, match="one optimizer step"):
        t.updater.update(replace(batch, deferred=(weight,)), t.knobs, step=0)
