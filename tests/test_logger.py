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

    logger = RunLogger(tmp_path, total_steps=1, progress=progress)
    text = "reward 'x' failed on completion '[/x] [yellow]4[/yellow]'"
    logger.note(text, "yellow")
    logger.note("plain [bold]words")
    logger.close()
    out = capsys.readouterr().out
    assert text in out and "plain [bold]words" in out


def test_trim_step_logs_by_hand(tmp_path):
    """Lines of steps after the checkpoint go; a last line cut by a kill (here in the middle of a
    two-byte character) goes and is reported; a whole last line that only lacks its newline stays."""
    from grpo.infra.logger import trim_step_logs

    (tmp_path / "metrics.jsonl").write_bytes(b'{"step": 1, "a": 1}\n{"step": 2}\n{"step": 3}\n{"step": 4, "a": 0.')
    (tmp_path / "samples.jsonl").write_bytes('{"step": 2, "c": "é"}\n{"step": 3, "c": "é"}\n{"step": 3, "c": "'
                                             .encode() + "é".encode()[:1])
    (tmp_path / "eval_completions.jsonl").write_bytes(b'{"step": 1}\n{"step": 2}')
    assert trim_step_logs(tmp_path, 2) == ["metrics.jsonl", "samples.jsonl"]
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "a": 1}\n{"step": 2}\n'
    assert (tmp_path / "samples.jsonl").read_text() == '{"step": 2, "c": "é"}\n'
    assert (tmp_path / "eval_completions.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n'
    assert trim_step_logs(tmp_path, 2) == []  # nothing left to drop
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval_completions.jsonl", "metrics.jsonl", "samples.jsonl"]


def test_a_damaged_line_before_the_end_is_an_error_naming_it(tmp_path):
    from grpo.errors import CheckpointError
    from grpo.infra.logger import trim_step_logs

    text = '{"step": 1}\n{"step": 2, "a": \n{"step": 3}\n'
    (tmp_path / "metrics.jsonl").write_text(text)
    with pytest.raises(CheckpointError, match=r"metrics\.jsonl: line 2 is not a JSON object with a step"):
        trim_step_logs(tmp_path, 1)
    assert (tmp_path / "metrics.jsonl").read_text() == text  # left as it was
