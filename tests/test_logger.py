"""The run logger: every numeric metric of metrics.jsonl also reaches TensorBoard."""

from __future__ import annotations

import json

from grpo.trainer import Trainer
from tests.test_trainer import make_cfg


def test_tensorboard_gets_every_numeric_metric(tmp_path, tiny_model_dir, tiny_dataset):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, eval_prompts=0, max_steps=2, report_to="tensorboard",
                   dynamic_sampling=True, clip_target_band=[0.05, 0.2], num_iterations=2, consistency_steps=1, consistency_prompts=2)
    t = Trainer(cfg)
    t.train()
    lines = [json.loads(l) for l in (t.run_dir / "metrics.jsonl").read_text().splitlines()]
    numeric = {k for line in lines for k, v in line.items()
               if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert {"epsilon", "dynamic_sampling_dropped_share", "consistency_cv", "nonfinite_count"} <= numeric
    acc = EventAccumulator(str(t.run_dir / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert numeric <= tags, sorted(numeric - tags)
    assert [e.step for e in acc.Scalars("reward_mean")] == [1, 2]
