"""Asynchronous rollouts on the real trainer, engine process and rewards: K = 0 is the synchronous run
exactly; the staleness bound holds (admission and drops); resume draws no prompt twice and loses none."""

from __future__ import annotations

import json

import pytest
import torch

from grpo.train.trainer import Trainer
from tests.conftest import TEST_SEED
from tests.test_trainer import make_cfg


class Recording(Trainer):
    """The trainer, keeping every batch's prompt and completion ids."""

    def prepare(self, ro, *args, **kw):
        self.seen = getattr(self, "seen", []) + [(ro.prompt_ids.clone(), ro.completion_ids.clone())]
        return super().prepare(ro, *args, **kw)


def _same_batches(a: Recording, b: Recording) -> None:
    assert len(a.seen) == len(b.seen)
    for (pa, ca), (pb, cb) in zip(a.seen, b.seen):
        assert torch.equal(pa, pb) and torch.equal(ca, cb)


def _lines(run_dir):
    return [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("backend", ["fast", "hf"])
def test_max_staleness_zero_is_the_synchronous_run(tmp_path, tiny_model_dir, tiny_dataset, backend):
    """K = 0: the producer draws step d only with the weights of step d, keyed as the synchronous
    loop keys it, and no token is stale, so no correction applies: the same completions at every
    step and the same final weights, bit for bit."""
    kw = dict(max_steps=3, rollout_backend=backend, decode_kernels="mkl", eval_prompts=0, log_completions_steps=1,
              async_engine_threads=1)
    sync = Recording(make_cfg(tmp_path / "sync", tiny_model_dir, tiny_dataset, **kw))
    sync.train()
    asyn = Recording(make_cfg(tmp_path / "async", tiny_model_dir, tiny_dataset, async_rollouts=True, max_staleness=0,
                              **kw))
    asyn.train()
    _same_batches(sync, asyn)
    for (name, a), b in zip(sync.policy.named_parameters(), asyn.policy.parameters()):
        assert torch.equal(a, b), name
    lines = _lines(asyn.run_dir)
    assert [l["async/staleness_max"] for l in lines] == [0, 0, 0]
    assert all(l["async/stale_token_share"] == 0.0 and l["async/dropped_groups"] == 0 for l in lines)
