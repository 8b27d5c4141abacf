"""Run output: metrics.jsonl, samples.jsonl, the trackers of report_to (infra/trackers.py), and a live rich
progress bar."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

from grpo.errors import CheckpointError
from grpo.infra.trackers import Trackers

HEADLINE = ("reward_mean", "accuracy", "kl", "clip_fraction", "completion_length_mean", "step_seconds")
EVAL_COMPLETIONS = "eval_completions.jsonl"  # the periodic evaluation's completions (grpo.train.evals)
# the run folder's logs of one JSON object a line, each with the step it belongs to
STEP_LOGS = ("metrics.jsonl", "samples.jsonl", EVAL_COMPLETIONS)


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _line_step(line: bytes) -> int | None:
    """The step of one log line, None when it is not a JSON object with an integer step."""
    try:
        row = json.loads(line)
    except ValueError:  # not JSON, or not UTF-8
        return None
    step = row.get("step") if isinstance(row, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def trim_step_logs(run_dir: Path, step: int) -> list[str]:
    """Make the run folder's STEP_LOGS end at ``step``, the checkpoint a run resumes from, so the
    resumed run's logs equal an uninterrupted run's: lines of later steps (written after that
    checkpoint by a run that then died) are dropped, and so is a last line a kill cut short (no
    newline and not a whole JSON object). Returns the names of the files that ended in a cut line.
    Any other line that is not a JSON object with a step is an error naming the file and line, and
    the file is left as it is."""
    cut = []
    for name in STEP_LOGS:
        path = run_dir / name
        if not path.is_file():
            continue
        data = path.read_bytes()
        lines = data.split(b"\n")
        tail = lines.pop()  # b"" when the file ends with its newline
        if tail.strip() and _line_step(tail) is None:
            cut.append(name)
        elif tail.strip():
            lines.append(tail)  # a whole line that only lacks its newline
        kept = []
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            line_step = _line_step(line)
            if line_step is None:
                raise CheckpointError(f"{path}: line {i} is not a JSON object with a step "
                                      f"({line[:80]!r}); mend or remove that line to resume")
            if line_step <= step:
                kept.append(line + b"\n")
        new = b"".join(kept)
        if new != data:
            tmp = path.with_name(f".{name}.tmp")
            tmp.write_bytes(new)
            os.replace(tmp, path)  # a kill now leaves the old file or the new one, never half of it
    return cut


class RunLogger:
    """Writes one JSON line per step (and to every tracker of ``report_to``), sample completions, and the
    progress bar."""

    def __init__(self, run_dir: Path, *, total_steps: int, start_step: int = 0, report_to: tuple[str, ...] = (),
                 params: dict | None = None, progress: bool = True):
        self.run_dir = run_dir
        self.metrics_path = run_dir / "metrics.jsonl"
        self.samples_path = run_dir / "samples.jsonl"
        self.progress = None  # set below; a tracker's warning before then is printed plainly
        self.trackers = Trackers(list(report_to), run_dir, params or {}, start_step=start_step,
                                 warn=lambda t: self.note(t, "yellow"))
        self.plain = None  # not a terminal: one whole line per step instead of a bar (a bar is cut to 80 columns)
        if progress and not sys.stdout.isatty():
            self.plain = _PlainProgress(total_steps, start_step)
        elif progress:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
            from rich.progress import TimeRemainingColumn

            self.progress = Progress(TextColumn("[bold]grpo"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.description}"))
            self.task = self.progress.add_task("", total=total_steps, completed=start_step)
            self.progress.start()

    def log_step(self, step: int, metrics: dict) -> None:
        line = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(line) + "\n")
        self.trackers.log(step, metrics)
        desc = "  ".join(f"{k.replace('completion_length_mean', 'len')}={metrics[k]:.3g}" for k in HEADLINE
                         if isinstance(metrics.get(k), (int, float)))
        if self.progress is not None:
            self.progress.update(self.task, completed=step, description=desc)
        if self.plain is not None:
            self.plain.line(step, desc)

    def log_samples(self, step: int, rows: list[dict], file: str = "samples.jsonl") -> None:
        """Rows of one step into ``file`` of the run folder (samples.jsonl; eval_completions.jsonl)."""
        with (self.run_dir / file).open("a") as f:
            for r in rows:
                f.write(json.dumps({"step": step, **r}) + "\n")

    def note(self, text: str, style: str | None = None) -> None:
        """A line for the user, printed as given: never read as rich markup, since it can quote a
        completion (a stray closing tag would raise). ``style`` colours it on the progress console."""
        if self.progress is not None:  # soft wrap: a long line stays one line (the terminal folds it)
            self.progress.console.print(text, style=style, markup=False, soft_wrap=True)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
        self.trackers.close()


class _PlainProgress:
    """The progress bar's content for a log file or a pipe: 'step 3/25  reward_mean=...  (1m02s, ~2m40s left)'."""

    def __init__(self, total: int, start: int):
        self.total, self.start, self.t0 = total, start, None  # the clock starts at the first step's line

    def line(self, step: int, desc: str) -> None:
        now = time.monotonic()
        if self.t0 is None:  # the evaluation before training is not a step: not in the rate
            self.t0, self.first = now, step
        elapsed = now - self.t0
        done = step - self.first
        left = elapsed / done * (self.total - step) if done > 0 else None
        when = _clock(elapsed) + (f", ~{_clock(left)} left" if left is not None and step < self.total else "")
        print(f"step {step}/{self.total}  {desc}  ({when})", flush=True)


def _clock(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


class NullLogger:
    """What processes other than rank 0 log to under torchrun: nothing (one progress bar, one metrics
    file per run)."""

    def log_step(self, step: int, metrics: dict) -> None:
        pass

    def log_samples(self, step: int, rows: list[dict], file: str = "samples.jsonl") -> None:
        pass

    def note(self, text: str, style: str | None = None) -> None:
        pass

    def close(self) -> None:
        pass
