"""Stage timers in every metrics line and evaluation during training (issue 27)."""

import json

import pytest

from grpo.infra.timing import STAGES, NullTimer, StageTimer, stage_key
from grpo.train.evals import EVAL_COMPLETIONS
from tests.reward_server import RewardServer
from tests.rewards_for_tests import odd_length
from tests.test_trainer import make_cfg
from grpo.train.trainer import Trainer


def test_timer_adds_repeated_stages_and_take_resets():
    t = StageTimer()
    for _ in range(3):
        with t.stage("rewards"):
            pass
    with pytest.raises(KeyError, match="unknown stage 'nope'"):
        with t.stage("nope"):
            pass
    got = t.take(("rewards", "update"))
    assert set(got) == {"time/rewards_seconds", "time/update_seconds"} and got["time/update_seconds"] == 0.0
    assert got["time/rewards_seconds"] > 0 and t.take()["time/rewards_seconds"] == 0.0
    with NullTimer().stage("anything"):  # outside a trainer nothing is timed or checked
        pass


def test_eval_steps_needs_held_out_prompts():
    from grpo.config import load_config
    from grpo.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^eval_steps: evaluation during training needs held-out prompts"):
        load_config(None, ["eval_steps=5", "eval_prompts=0"])


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("i27")
    data = tmp / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i} plus {i}?", "answer": str(2 * i)}) + "\n" for i in range(24)))
    server = RewardServer()  # the run also trains on an async reward and one served over HTTP
    rewards = f"tests.rewards_for_tests:odd_length,tests.rewards_for_tests:async_digit_share,{server.url('/ok')}"
    cfg = make_cfg(tmp, tiny_model_dir, data, max_steps=4, eval_steps=2, save_steps=2, beta=0.1, num_iterations=2,
                   eval_prompts=4, eval_batch_size=2, rewards=rewards, reward_weights=[1.0, 1.0, 0.01],
                   report_to="tensorboard")
    try:
        t = Trainer(cfg)
        result = t.train()
    finally:
        server.close()
    lines = [json.loads(x) for x in (t.run_dir / "metrics.jsonl").read_text().splitlines()]
    return t, result, lines, server


def test_async_and_url_rewards_in_a_run(run):
    t, _, lines, server = run
    url = t.cfg.reward_names[2]
    steps = [b for path, b in server.requests if path == "/ok"]
    assert len(steps) == 4 and all(len(b["completions"]) == 8 for b in steps)  # one request per step: B * G
    for line, batch in zip(lines, steps):
        want = sum(len(c) + len(s["answer"]) for c, s in zip(batch["completions"], batch["samples"])) / 8
        assert line[f"rewards/{url}"] == pytest.approx(want) and line["reward_failures"] == 0
        assert 0 <= line["rewards/tests.rewards_for_tests:async_digit_share"] <= 1


def test_every_stage_in_every_line_and_within_the_step(run):
    _, _, lines, _ = run
    assert [x["step"] for x in lines] == [1, 2, 3, 4]
    for line in lines:
        stages = [line[stage_key(s)] for s in STAGES]
        assert all(v >= 0 for v in stages), line
        assert sum(stages) <= line["step_seconds"] + 1e-9, line
        for s in ("sampling", "rewards", "old_logp", "reference", "update"):  # ran on every step here
            assert line[stage_key(s)] > 0, (s, line)
    assert [x["time/eval_seconds"] > 0 for x in lines] == [False, True, False, True]
    assert [x["time/checkpoint_seconds"] > 0 for x in lines] == [False, True, False, False]  # the last save is the run's


def test_eval_metrics_and_completions_table(run):
    t, result, lines, _ = run
    assert [("eval/accuracy" in x) for x in lines] == [False, True, False, True]
    line = lines[1]
    rows = [json.loads(x) for x in (t.run_dir / EVAL_COMPLETIONS).read_text().splitlines()]
    # eval_batch_size 2: the table holds the first two prompts of each batch, so all four held-out prompts
    assert [r["step"] for r in rows] == [2] * 4 + [4] * 4
    assert [r["prompt"] for r in rows] == [s["prompt"] for s in t.task.eval] * 2
    rows, last_rows = rows[:4], rows[4:]
    for r in rows:  # the verifier's own value of the logged completion
        assert r["reward"] == odd_length(r["completion"], {})
    assert line["eval/accuracy"] == sum(r["reward"] >= 1 for r in rows) / 4
    assert 0 <= line["eval/pass@k"] <= 1  # sampled (k = eval_pass_k = 2 on eval_pass_prompts = 2)
    assert line["eval/mean_length"] > 0
    # the evaluation at the last step is the run's "after" (the same weights are not evaluated twice)
    assert result["after"]["accuracy"] == lines[3]["eval/accuracy"]
    assert [ex["completion"] for ex in result["after"]["examples"]] == [r["completion"] for r in last_rows]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(t.run_dir / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("eval/accuracy")] == [2, 4]
    assert [e.step for e in acc.Scalars("time/update_seconds")] == [1, 2, 3, 4]


def test_report_shows_stage_times_eval_plot_and_completions(run, tmp_path):
    import html

    from grpo.commands.report import build_report

    t, _, lines, _ = run
    page = build_report([t.run_dir], tmp_path / "rep").read_text()
    times = page.split('<table id="stage_times">')[1].split("</table>")[0]
    for s in STAGES:
        assert f"<th>{s}</th>" in times
    mean_update = sum(x["time/update_seconds"] for x in lines) / len(lines)
    assert f"<td>{mean_update:.4g}</td>" in times
    table = page.split('<table id="eval_completions">')[1].split("</table>")[0]
    rows = [json.loads(x) for x in (t.run_dir / EVAL_COMPLETIONS).read_text().splitlines()]
    assert table.count("<tr>") == 1 + len(rows) and all(html.escape(r["prompt"]) in table for r in rows)
    assert (tmp_path / "rep" / "eval_during_training.png").stat().st_size > 1000


@pytest.mark.parametrize("when, sigterm_at, kw", [
    ("before", 1, dict(max_steps=1)),
    ("periodic", 13, dict(max_steps=3, eval_steps=1)),  # 4 calls before, 8 of step 1, then step 1's evaluation
    ("after", 13, dict(max_steps=1)),
])
def test_sigterm_during_an_evaluation_stops_it_and_keeps_what_it_scored(tmp_path, tiny_model_dir, tiny_dataset,
                                                                        when, sigterm_at, kw):
    """SIGTERM arriving during the initial, a periodic or the final evaluation (sent by the verifier
    itself on its call ``sigterm_at``, as a scheduler would) stops it at the next batch instead of
    after all the held-out prompts: the run saves its checkpoint and returns, and the evaluation's
    partial result is kept, marked interrupted with the count it scored (the first batch of 2)."""
    from tests import rewards_for_tests as r

    r.counted.update(n=0, fail_from=0, sigterm_at=sigterm_at)
    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, rewards="tests.rewards_for_tests:counting", eval_prompts=4,
                   eval_batch_size=2, eval_pass_k=0, **kw)
    t = Trainer(cfg)
    try:
        result = t.train()
    finally:
        r.counted.update(sigterm_at=0)
    assert result["interrupted"] == "SIGTERM"
    saved = json.loads((t.run_dir / "eval.json").read_text())
    steps = {"before": 0, "periodic": 1, "after": 1}[when]
    assert (t.run_dir / "checkpoints" / "latest").read_text().strip() == f"step-{steps}"
    if when == "periodic":
        line = json.loads((t.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
        assert line["step"] == 1 and line["eval/interrupted"] == 1 and line["eval/prompts_scored"] == 2
        assert "after" not in saved and "interrupted" not in saved["before"]
        return
    partial = saved[when]
    assert partial["interrupted"] is True and partial["prompts_scored"] == 2 and partial["n_prompts"] == 4
    assert saved["interrupted"] == "SIGTERM" and r.counted["n"] == sigterm_at + 1  # no batch after the signal
