"""The data filter: the connective filter and the win-rate anchors by hand, and `grpo data filter`
with two models and a judge writing a JSONL the trainer reads."""

import json

import pytest

from grpo.cli import main
from grpo.data import load_task
from grpo.data.filter import connective_filter, select_anchors, win_rates

THREE_STEPS = "由 a = 2 得 b = 4。因此 c = b + 1 = 5。故 d = 10。"
GSM_TWO = "He sold 48/2 = <<48/2=24>>24.\nThen 48+24 = <<48+24=72>>72.\n#### 72"


def test_connective_filter_keeps_three_logical_steps():
    rows = [{"prompt": "p1", "solution": THREE_STEPS}, {"prompt": "p2", "solution": GSM_TWO},
            {"prompt": "What is Python?"}, {"prompt": "x = 1. So y = 2. Hence z = 3."}]
    kept, stats = connective_filter(rows, min_steps=3)
    assert [r["prompt"] for r in kept] == ["p1", "x = 1. So y = 2. Hence z = 3."]
    assert [r["logical_steps"] for r in kept] == [3, 3]
    assert stats == {"rows": 4, "kept": 2, "kept_share": 0.5}
    assert len(connective_filter(rows, min_steps=2)[0]) == 3


def test_win_rates_and_anchors_by_hand():
    assert win_rates([3.0, 1.0, 1.0, 0.0]) == [1.0, 0.5, 0.5, 0.0]
    cands = [{"score": s} for s in (0.9, 0.1, 0.5, 0.5, 0.3, None)]
    got = select_anchors(cands, high=0.8, low=0.2)
    assert [c["win_rate"] for c in got["candidates"]] == [1.0, 0.2, 0.7, 0.7, 0.4, 0.0]
    assert [c["score"] for c in got["anchor_high"]] == [0.9]
    assert [c["score"] for c in got["anchor_low"]] == [None]  # 0.2 is not below 0.2
    with pytest.raises(ValueError, match="low"):
        select_anchors(cands, high=0.1, low=0.5)


def test_cli_filter_with_two_models_writes_rows_the_trainer_reads(tmp_path, tiny_model_dir):
    src = tmp_path / "problems.jsonl"
    rows = [{"prompt": f"Problem {i}", "answer": str(i), "solution": THREE_STEPS if i % 2 else GSM_TWO}
            for i in range(12)]
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "filtered.jsonl"
    rc = main(["data", "filter", "--task", str(src), "--out", str(out), "--models",
               f"{tiny_model_dir},{tiny_model_dir}", "--samples", "2", "--max-new-tokens", "6",
               "--judge", "tests.rewards_for_tests:digit_share", "reward_timeout=0"])
    assert rc == 0
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(got) == 6 and all(r["logical_steps"] == 3 for r in got)
    for r in got:
        assert len(r["candidates"]) == 4  # 2 models x 2 samples
        scores = [c["score"] for c in r["candidates"]]
        assert [c["win_rate"] for c in r["candidates"]] == win_rates(scores)  # each candidate's, from the scores
        # the anchors are exactly the candidates past the bounds (a problem whose scores tie has none)
        assert r["anchor_high"] == [c for c in r["candidates"] if c["win_rate"] > 0.8]
        assert r["anchor_low"] == [c for c in r["candidates"] if c["win_rate"] < 0.2]
    task = load_task(str(out), eval_size=2)
    assert len(task.train) == 4 and {s["prompt"] for s in task.train + task.eval} == {r["prompt"] for r in got}
    assert main(["data", "nonsense"]) == 2
