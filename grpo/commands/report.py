"""`grpo report RUN_DIR [RUN_DIR ...]`: PNG plots of a run's metrics against steps (runs overlaid)
and report.html with the plots, each run's resolved config, before/after evaluation and sample
completions with their rewards. Everything from the run folders is HTML-escaped."""

from __future__ import annotations

import argparse
import html
import json
import math
from pathlib import Path

import yaml

from grpo.audit.run import AUDIT_HEADER, audit_rows
from grpo.infra.timing import STAGES, stage_key
from grpo.commands.episodes_html import episode_sections

# (file stem, title, metric keys in metrics.jsonl): one PNG each
PLOTS = (
    ("reward", "reward (mean over the step's completions)", ("reward_mean",)),
    ("accuracy", "training accuracy (first reward >= 1)", ("accuracy",)),
    ("kl", "KL to the reference", ("kl",)),
    ("entropy", "token entropy", ("entropy",)),
    ("clip_fraction", "clip fraction", ("clip_fraction",)),
    ("zero_variance_share", "zero-variance share of trained groups", ("zero_variance_share",)),
    ("lengths", "completion length (tokens): mean solid, max dashed", ("completion_length_mean",
                                                                       "completion_length_max")),
    ("step_time", "step time (s)", ("step_seconds",)),
    # the seeds' monitors and symptoms (seed 002 section 4, seed 003 section 3.4, seed 004)
    ("gav", "group advantage std GAV (r_i - mean of the others; healthy 0.15-0.25)", ("gav",)),
    ("consistency", "consistency probe CGC: coefficient of variation (<0.15 converging, >0.35 guessing)",
     ("consistency_cv",)),
    ("group_outcomes", "groups all correct (solid) and all wrong (dashed)", ("all_correct_share",
                                                                            "all_wrong_share")),
    ("reward_group_std", "per-group reward std (mean over groups)", ("reward_group_std",)),
    ("diversity", "distinct-1 (solid) and distinct-2 (dashed) of a step's completions", ("distinct_1",
                                                                                       "distinct_2")),
    ("loop_share", "share of completions that loop (a span repeated 4 times)", ("loop_share",)),
)
# evaluation during training (eval_steps): greedy accuracy solid, pass@k dashed
PLOTS += (("eval_during_training", "held-out greedy accuracy (solid), pass@k (dashed)", ("eval/accuracy", "eval/pass@k")),)
SAMPLES_PER_RUN = 24
EVAL_COMPLETIONS_PER_RUN = 24


def _read_jsonl(path: Path, what: str) -> list[dict]:
    if not path.is_file():
        return []
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {i} of {what} is not JSON ({e})") from None
    return rows


def load_run(run_dir: str | Path) -> dict:
    """A run folder's metrics, samples, config and evaluation; a folder without metrics.jsonl is an error."""
    d = Path(run_dir)
    if not (d / "metrics.jsonl").is_file():
        raise FileNotFoundError(f"{d}: no metrics.jsonl (is it a grpo run folder?)")
    config = yaml.safe_load((d / "config.yaml").read_text()) if (d / "config.yaml").is_file() else {}
    evaluation = json.loads((d / "eval.json").read_text()) if (d / "eval.json").is_file() else {}
    return {"name": d.resolve().name, "dir": d, "metrics": _read_jsonl(d / "metrics.jsonl", "metrics"),
            "samples": _read_jsonl(d / "samples.jsonl", "samples"), "config": config or {},
            "eval_completions": _read_jsonl(d / "eval_completions.jsonl", "evaluation completions"),
            "eval": evaluation, "audit": json.loads((d / "audit.json").read_text()) if (d / "audit.json").is_file() else {}}


def _series(rows: list[dict], key: str) -> tuple[list, list]:
    pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float)) and
           not isinstance(r.get(key), bool) and math.isfinite(r[key])]
    return [p[0] for p in pts], [p[1] for p in pts]


def logged_plots(runs: list[dict]) -> list[tuple]:
    """The entries of PLOTS with a finite value of one of their keys in some run's metrics."""
    return [p for p in PLOTS if any(_series(run["metrics"], key)[0] for run in runs for key in p[2])]


def plot_runs(runs: list[dict], out: Path) -> list[str]:
    """One PNG per entry of PLOTS that some run logged, in ``out`` (a metric no run logged gets no
    panel: an empty one reads as something broken); returns their names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    names = []
    for stem, title, keys in logged_plots(runs):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        drawn = False
        for i, run in enumerate(runs):
            color = f"C{i % 10}"
            for j, key in enumerate(keys):
                xs, ys = _series(run["metrics"], key)
                if xs:
                    ax.plot(xs, ys, color=color, linestyle="-" if j == 0 else "--", marker=".",
                            label=run["name"] if j == 0 else None)
                    drawn = True
        if drawn:
            ax.legend(fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / f"{stem}.png", dpi=90)
        plt.close(fig)
        names.append(f"{stem}.png")
    return names


def _table(table_id: str, header: list[str], rows: list[list]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{e(_fmt(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table id="{e(table_id)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def _eval_rows(runs: list[dict]) -> list[list]:
    rows = []
    for run in runs:
        ev = run["eval"]
        b, a = ev.get("before") or {}, ev.get("after") or {}
        rows.append([run["name"], ev.get("n_prompts"), b.get("accuracy"), a.get("accuracy"),
                     b.get("pass@k"), a.get("pass@k"), b.get("mean_length"), a.get("mean_length"),
                     b.get("truncated_share"), a.get("truncated_share")])
    return rows


def _stage_rows(runs: list[dict]) -> tuple[list[str], list[list]]:
    """Mean seconds per step of each stage (time/<stage>_seconds) and of the step, per run."""
    order = {stage_key(s): i for i, s in enumerate(STAGES)}  # a step's order, unknown ones after
    stages = sorted({k for run in runs for line in run["metrics"] for k in line if k.startswith("time/")},
                    key=lambda k: (order.get(k, len(order)), k))
    rows = []
    for run in runs:
        row = [run["name"]]
        for key in [*stages, "step_seconds"]:
            ys = _series(run["metrics"], key)[1]
            row.append(sum(ys) / len(ys) if ys else None)
        rows.append(row)
    return [s[len("time/"):].removesuffix("_seconds") for s in stages], rows


def _training_sections(runs: list[dict]) -> list[str]:
    """Stage times, and the completions of the evaluations during training (eval_steps)."""
    stages, rows = _stage_rows(runs)
    completions = [[run["name"], r.get("step"), r.get("prompt"), r.get("completion"), r.get("answer"), r.get("reward")]
                   for run in runs for r in run["eval_completions"][-EVAL_COMPLETIONS_PER_RUN:]]
    return ["<h2>Time per stage (mean seconds per logged step)</h2>",
            _table("stage_times", ["run", *stages, "step"], rows),
            f"<h2>Evaluation completions during training (last {EVAL_COMPLETIONS_PER_RUN} per run)</h2>",
            _table("eval_completions", ["run", "step", "prompt", "completion", "answer", "reward"], completions)]


def render_html(runs: list[dict], images: list[str]) -> str:
    """The report page: plots, config, evaluation and samples tables."""
    e = html.escape
    keys = sorted({k for run in runs for k in run["config"]})
    config_rows = [[k, *[run["config"].get(k) for run in runs]] for k in keys]
    sample_rows = [[run["name"], s.get("step"), s.get("prompt"), s.get("completion"), s.get("answer"),
                    s.get("reward")] for run in runs for s in run["samples"][-SAMPLES_PER_RUN:]]
    imgs = "".join(f'<figure><img src="{e(n)}" alt="{e(n)}"></figure>' for n in images)
    return "\n".join([
        "<!doctype html>", '<html><head><meta charset="utf-8"><title>grpo report</title>',
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:2px 6px;font-size:12px;vertical-align:top;white-space:pre-wrap}"
        "figure{display:inline-block;margin:4px}ol.episode li{white-space:pre-wrap;font-size:12px;margin:2px 0}"
        "li.tool{color:#555}</style></head><body>",
        f"<h1>grpo report: {e(', '.join(run['name'] for run in runs))}</h1>",
        "<h2>Metrics</h2>", f'<div id="plots">{imgs}</div>',
        "<h2>Evaluation (held-out greedy accuracy)</h2>",
        _table("evaluation", ["run", "prompts", "accuracy before", "accuracy after", "pass@k before",
                              "pass@k after", "length before", "length after", "cut at the token limit before",
                              "cut at the token limit after"], _eval_rows(runs)),
        *_training_sections(runs),
        "<h2>Reasoning-chain audit (grpo audit: defects per 100 tokens)</h2>",
        _table("audit", AUDIT_HEADER, audit_rows(runs)),
        "<h2>Resolved config</h2>", _table("config", ["key", *[run["name"] for run in runs]], config_rows),
        f"<h2>Sample completions (last {SAMPLES_PER_RUN} per run)</h2>",
        _table("samples", ["run", "step", "prompt", "completion", "answer", "reward"], sample_rows),
        *episode_sections(runs),
        "</body></html>"])


def build_report(run_dirs: list[str | Path], out: str | Path | None = None) -> Path:
    """Write the PNGs and report.html for the runs into ``out`` (default: the first run's report/);
    returns the path of report.html."""
    if not run_dirs:
        raise ValueError("grpo report: name at least one run folder")
    runs = [load_run(d) for d in run_dirs]
    names = [run["name"] for run in runs]
    for run in runs:  # runs in folders of the same name: label them parent/name, then by position
        if names.count(run["name"]) > 1:
            run["name"] = f"{Path(run['dir']).resolve().parent.name}/{run['name']}"
    for i, run in enumerate(runs):
        if [r["name"] for r in runs].count(run["name"]) > 1:
            run["name"] = f"{run['name']} #{i + 1}"
    out_dir = Path(out) if out else Path(run_dirs[0]) / "report"
    out_dir.mkdir(parents=True, exist_ok=True)
    images = plot_runs(runs, out_dir)
    page = out_dir / "report.html"
    page.write_text(render_html(runs, images))
    return page


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="grpo report", description="Plots and an HTML page of one or more runs.")
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR")
    ap.add_argument("--out", help="output folder (default: RUN_DIR/report of the first run)")
    args = ap.parse_args(argv)
    page = build_report(args.runs, args.out)
    print(f"report: {page}")
    return 0
