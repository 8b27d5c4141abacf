"""`grpo report` on real tiny-model runs: the PNGs, and report.html loaded in headless Chromium."""

from __future__ import annotations

import html
import json

import pytest

from grpo.cli import main as cli_main
from grpo.commands.report import build_report, load_run, logged_plots
from grpo.train.trainer import Trainer
from tests.conftest import headless_chromium
from tests.test_trainer import make_cfg


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, tiny_model_dir):
    """Two short runs with before/after evaluation and sample completions."""
    base = tmp_path_factory.mktemp("report")
    data = base / "sums.jsonl"
    rows = [{"prompt": f"What is {a} + {b}? <b>&", "answer": str(a + b)} for a in range(1, 7) for b in range(1, 5)]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    runs = []
    for name, extra in (("a", {}), ("b", {"learning_rate": 0.05})):
        cfg = make_cfg(base / name, tiny_model_dir, data, max_steps=3, eval_prompts=4, eval_pass_k=0, **extra)
        t = Trainer(cfg)
        t.train()
        runs.append(t.run_dir)
    return runs


def test_report_html_loads_in_headless_chromium(two_runs, tmp_path):
    out = tmp_path / "report"
    assert cli_main(["report", *map(str, two_runs), "--out", str(out)]) == 0
    pngs = sorted(p.name for p in out.glob("*.png"))
    drawn = logged_plots([load_run(r) for r in two_runs])
    assert pngs == sorted(f"{stem}.png" for stem, _, _ in drawn)
    assert "consistency.png" not in pngs and "eval_during_training.png" not in pngs  # not logged: no empty panel
    assert {"reward.png", "kl.png", "lengths.png"} <= set(pngs)
    browser = headless_chromium()
    try:
        browser.get((out / "report.html").resolve().as_uri())
        imgs = browser.find_elements("tag name", "img")
        assert len(imgs) == len(drawn)
        for img in imgs:
            assert browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth", img) > 0, \
                img.get_attribute("src")
        for table_id in ("config", "evaluation", "samples"):
            rows = browser.find_elements("css selector", f"table#{table_id} tbody tr")
            assert rows, table_id
        # evaluation: one row per run with before and after accuracy
        ev = [r.text for r in browser.find_elements("css selector", "table#evaluation tbody tr")]
        assert len(ev) == 2
        # the prompt's markup arrives as text, not as elements
        cells = browser.find_elements("css selector", "table#samples tbody td")
        assert any("<b>&" in c.text for c in cells)
        assert not browser.find_elements("css selector", "table#samples b")
    finally:
        browser.quit()


def test_report_escapes_and_plots_one_run(two_runs, tmp_path):
    page = build_report([two_runs[0]], tmp_path / "one")
    text = page.read_text()
    assert "&lt;b&gt;&amp;" in text and "<b>&" not in text
    run = load_run(two_runs[0])
    assert html.escape(str(run["config"]["learning_rate"])) in text
    assert all((tmp_path / "one" / f"{stem}.png").stat().st_size > 1000 for stem, _, _ in logged_plots([run]))
    assert not (tmp_path / "one" / "consistency.png").exists()


def test_report_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    assert cli_main(["report", str(tmp_path)]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err
