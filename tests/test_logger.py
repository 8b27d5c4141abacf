"""The run logger: every numeric metric of metrics.jsonl also reaches TensorBoard."""

from __future__ import annotations

import json

import pytest

from grpo.train.trainer import Trainer
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


@pytest.mark.parametrize("progress", [False, True])
def test_notes_print_their_text_as_given(tmp_path, capsys, progress):
    """A note can quote a completion, which may hold anything, square brackets included: it is printed
    as given (with or without the progress bar), never read as rich markup, whose closing tag with no
    opening one would raise and stop the run; a style colours it without adding text."""
    from grpo.infra.logger import RunLogger

    logger = RunLogger(tmp_path, total_steps=1, tensorboard=False, progress=progress)
    text = "reward 'x' failed on completion '[/x] [yellow]4[/yellow]'"
    logger.note(text, "yellow")
    logger.note("plain [bold]words")
    logger.close()
    out = capsys.readouterr().out
    assert text in out and "plain [bold]words" in out
