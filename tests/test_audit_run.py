"""The audit end to end on a tiny random model: densities are the findings over the tokens, the files
land in the output folder, `grpo report` shows them, and `grpo audit` refuses a folder that is no run."""

import json
import math

import pytest

from grpo.audit.defects import KINDS, audit_completion
from grpo.audit.run import AuditSettings, audit_model, densities, pick_problems, write_audit
from grpo.cli import main
from grpo.models import load_models
from grpo.rewards import resolve_reward
from grpo.rollout import make_engine


def test_densities_pool_findings_over_tokens():
    rows = [{"tokens": 50, "counts": {"completeness": 1, "order": 0, "symbols": 2, "calculation": 0}},
            {"tokens": 150, "counts": {"completeness": 3, "order": 1, "symbols": 0, "calculation": 0}}]
    d = densities(rows)
    assert d["tokens"] == 200 and d["defects"]["completeness"] == 4
    assert d["per_100_tokens"] == {"completeness": 2.0, "order": 0.5, "symbols": 1.0, "calculation": 0.0}
    assert all(math.isnan(v) for v in densities([])["per_100_tokens"].values())


def test_problems_are_drawn_the_same_for_every_model():
    pool = [{"prompt": str(i)} for i in range(100)]
    a, b = pick_problems(pool, 10, 0), pick_problems(pool, 10, 0)
    assert a == b and len({p["prompt"] for p in a}) == 10 and a != pool[:10]
    assert pick_problems(pool[:5], 10, 0) == pool[:5]


def test_audit_of_a_tiny_model(tmp_path, tiny_model_dir, tiny_dataset):
    models = load_models(str(tiny_model_dir), need_reference=False)
    engine = make_engine("hf", models.policy, models.tokenizer)
    problems = [json.loads(line) for line in tiny_dataset.read_text().splitlines()][:5]
    summary, rows = audit_model(engine, problems, resolve_reward("numeric"), AuditSettings(
        max_new_tokens=12, batch_size=2))
    engine.close()
    assert summary["problems"] == len(rows) == 5
    for r, p in zip(rows, problems):  # each row's findings are the detectors' on its completion
        assert r["counts"] == audit_completion(r["completion"], p["prompt"]).counts() and 0 < r["tokens"] <= 12
    for k in KINDS:
        assert summary["per_100_tokens"][k] == pytest.approx(
            100 * sum(r["counts"][k] for r in rows) / sum(r["tokens"] for r in rows))
    path = write_audit(tmp_path / "out", {"trained": (summary, rows), "base": (summary, rows)}, {"task": "t"})
    saved = json.loads(path.read_text())
    assert set(saved["models"]) == {"trained", "base"}
    assert len((tmp_path / "out" / "audit_samples.jsonl").read_text().splitlines()) == 10


def test_report_shows_the_audit(tmp_path):
    from grpo.commands.report import load_run, render_html

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.1}) + "\n")
    s = {"problems": 3, "accuracy": 0.5, "mean_tokens": 20.0,
         "per_100_tokens": {"completeness": 1.25, "order": 0.0, "symbols": 0.5, "calculation": 2.0}}
    (run / "audit.json").write_text(json.dumps({"models": {"trained": s, "base": s}}))
    page = render_html([load_run(run)], [])
    table = page.split('<table id="audit">')[1].split("</table>")[0]
    assert table.count("<tr>") == 3 and "trained" in table and "base" in table and "1.25" in table


def test_cli_audit_writes_the_folder_and_refuses_a_non_run(tmp_path, tiny_model_dir, tiny_dataset, capsys):
    out = tmp_path / "audit"
    rc = main(["audit", "--model", str(tiny_model_dir), "--out", str(out), "--problems", "3",
               "--max-new-tokens", "8", f"task={tiny_dataset}", "eval_prompts=4"])
    assert rc == 0 and json.loads((out / "audit.json").read_text())["models"]["model"]["problems"] == 3
    assert main(["audit", str(tmp_path)]) == 2
    assert "is not a run folder" in capsys.readouterr().err


def test_cli_audit_of_a_run_folder_puts_trained_and_base_side_by_side(tmp_path, tiny_model_dir, tiny_dataset, capsys):
    from grpo.train.trainer import Trainer
    from tests.test_trainer import make_cfg

    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, max_steps=1, eval_pass_k=0)
    Trainer(cfg).train()
    run = tmp_path / "run"
    assert main(["audit", str(run), "--problems", "3", "--max-new-tokens", "6"]) == 0
    saved = json.loads((run / "audit.json").read_text())
    assert list(saved["models"]) == ["trained", "base"] and saved["labels"]["base"] == str(tiny_model_dir)
    rows = [json.loads(line) for line in (run / "audit_samples.jsonl").read_text().splitlines()]
    assert [r["model"] for r in rows] == ["trained"] * 3 + ["base"] * 3
    assert [r["prompt"] for r in rows[:3]] == [r["prompt"] for r in rows[3:]]  # the same problems
    assert "completeness / 100 tokens" in capsys.readouterr().out
