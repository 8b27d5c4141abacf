"""Tasks: disjoint held-out splits, user datasets with clear errors, seeded resumable sampling."""

import json
import re
from pathlib import Path

import pytest

from grpo.data.tasks import TaskLoading
from grpo.data import PromptSampler, load_task, render_prompt
from grpo.data.tasks import TASKS
from grpo.errors import DataError


def test_arithmetic_split_is_disjoint_and_fixed():
    t = load_task("arithmetic", eval_size=200, loading=TaskLoading(max_operand=30, ops="+"))
    assert len(t.eval) == 200 and len(t.train) == 700  # 30 * 30 problems
    assert not {s["prompt"] for s in t.eval} & {s["prompt"] for s in t.train}
    assert t.eval == load_task("arithmetic", eval_size=200, loading=TaskLoading(max_operand=30, ops="+")).eval
    s = t.eval[0]
    a, op, b = s["prompt"].removeprefix("What is ").rstrip("?").split()
    assert int(s["answer"]) == int(a) + int(b)


def test_gsm8k_local_file(tmp_path, monkeypatch):
    rows = [{"question": f"Q{i}?", "answer": f"work <<{i}*2={2 * i}>>\n#### {2 * i:,}"} for i in range(600, 700)]
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    monkeypatch.setenv("GRPO_GSM8K", str(path))
    t = load_task("gsm8k", eval_size=10)
    assert len(t.eval) == 10 and len(t.train) == 90
    assert {s["answer"] for s in t.train + t.eval} == {str(2 * i) for i in range(600, 700)}  # "1,200" -> "1200"


def test_gsm8k_full_copy_when_present(monkeypatch):
    """The real GSM8K train file, where this development checkout has one beside it (passed the way a
    user passes it: GRPO_GSM8K)."""
    path = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "train.jsonl"
    if not path.is_file():
        pytest.skip(f"no GSM8K copy at {path}")
    monkeypatch.setenv("GRPO_GSM8K", str(path))
    t = load_task("gsm8k", eval_size=50)
    assert len(t.eval) == 50 and len(t.train) > 7000
    assert all(s["answer"].lstrip("-").replace(".", "").isdigit() for s in t.train[:100])


def test_gsm8k_env_naming_a_missing_file_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_GSM8K", str(tmp_path / "nope.jsonl"))
    with pytest.raises(DataError, match=r"^GRPO_GSM8K=.*nope\.jsonl: no such file"):
        load_task("gsm8k", eval_size=10)


def test_user_jsonl(tiny_dataset):
    t = load_task(str(tiny_dataset), eval_size=4)
    assert len(t.train) == 20 and len(t.eval) == 4


def test_user_dataset_errors_name_file_and_row(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps({"prompt": "a", "answer": "1"}) + "\n" + json.dumps({"question": "b"}) + "\n")
    with pytest.raises(DataError, match=r"d.jsonl: row 2 has no field 'prompt'"):
        load_task(str(p), eval_size=0)
    p.write_text("{not json\n")
    with pytest.raises(DataError, match=r"d.jsonl:1: not valid JSON"):
        load_task(str(p), eval_size=0)
    p.write_text("")
    with pytest.raises(DataError, match=f"^{re.escape(str(p))}: the dataset is empty$"):
        load_task(str(p), eval_size=0)
    with pytest.raises(DataError) as err:  # the built-ins are listed, from the task registry
        load_task("nonexistent_file.jsonl", eval_size=0)
    assert str(err.value) == (f"task: 'nonexistent_file.jsonl' is not a built-in task {list(TASKS)}, an "
                              "existing file or dataset folder, or a hub dataset id (owner/name)")
    assert set(TASKS) >= {"arithmetic", "gsm8k", "code"}


def test_dataset_repository_folder_through_the_hub_loader(tmp_path):
    """A local copy of a hub dataset repository (data/<split>-*.parquet, as `git clone` of the repository
    gives) goes through datasets.load_dataset, the call a hub id takes: splits by name, the columns
    named by prompt_field/answer_field, an unknown split named in the error."""
    from datasets import Dataset

    repo = tmp_path / "owner" / "sums"
    (repo / "data").mkdir(parents=True)
    for split, base in (("train", 0), ("test", 100)):
        rows = [{"question": f"What is {base + i} + 1?", "solution": str(base + i + 1)} for i in range(12)]
        Dataset.from_list(rows).to_parquet(str(repo / "data" / f"{split}-00000-of-00001.parquet"))
    t = load_task(str(repo), eval_size=2, loading=TaskLoading(prompt_field="question", answer_field="solution", split="test"))
    assert len(t.train) == 10 and len(t.eval) == 2 and t.name == "sums"
    assert {s["answer"] for s in t.train + t.eval} == {str(101 + i) for i in range(12)}
    assert all(s["prompt"] == s["question"] for s in t.train)
    with pytest.raises(DataError, match=r"sums\[validation\]: .*validation.* \(set task_split\)"):
        load_task(str(repo), eval_size=2, loading=TaskLoading(prompt_field="question", answer_field="solution", split="validation"))


def test_sampler_epochs_and_resume():
    s = PromptSampler(5, seed=3)
    first = s.draw(3)
    state = s.state_dict()
    rest = [s.draw(3) for _ in range(4)]
    r = PromptSampler(5, seed=3)
    r.load_state_dict(state)
    assert [r.draw(3) for _ in range(4)] == rest
    assert sorted(first + rest[0][:2]) == [0, 1, 2, 3, 4]  # an epoch is a permutation


def test_render_prompt_uses_chat_template():
    from tests.conftest import build_tokenizer

    tok = build_tokenizer()
    text = render_prompt(tok, "What is 1 + 1?", "Answer briefly.")
    assert text == ("<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\nWhat is 1 + 1?<|im_end|>\n"
                    "<|im_start|>assistant\n")


def test_held_out_larger_than_dataset(tiny_dataset):
    with pytest.raises(DataError, match="eval_prompts"):
        load_task(str(tiny_dataset), eval_size=24)
    with pytest.raises(DataError, match="eval_prompts"):
        load_task("arithmetic", eval_size=400, loading=TaskLoading(max_operand=20, ops="+"))


def test_code_task_references_pass_their_own_tests():
    from grpo.rewards.code import plan_assert

    t = load_task("code", eval_size=200)
    assert len(t.train) + len(t.eval) == 48 and len(t.eval) == 12  # 200 capped at a quarter of 48
    assert not {s["prompt"] for s in t.train} & {s["prompt"] for s in t.eval}
    for s in t.train + t.eval:  # the reference solution satisfies every assert (checked in-process:
        ns = {}  # it is our own code)
        exec(s["answer"], ns)
        for test in s["tests"]:
            exprs, host, decide = plan_assert(test)
            got = iter(eval(e, ns) for e in exprs)
            assert decide([h[0] if h else next(got) for h in host]), (s["prompt"], test)


@pytest.mark.parametrize("fmt", ["json", "parquet"])
def test_json_and_parquet_tasks_load_like_the_same_jsonl(tmp_path, tiny_dataset, fmt):
    """A .json list of objects and a .parquet table hold the same rows as the .jsonl: they load into the
    same task (same held-out split, same order, answers as strings), under custom field names too."""
    rows = [json.loads(line) for line in tiny_dataset.read_text().splitlines()]
    renamed = [{"question": r["prompt"], "gold": int(r["answer"])} for r in rows]  # an int answer column
    path = tmp_path / f"sums.{fmt}"
    if fmt == "json":
        path.write_text(json.dumps(renamed))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(renamed), path)
    want = load_task(str(tiny_dataset), eval_size=4)
    got = load_task(str(path), eval_size=4, loading=TaskLoading(prompt_field="question", answer_field="gold"))
    strip = lambda part: [(s["prompt"], s["answer"]) for s in part]  # noqa: E731
    assert strip(got.train) == strip(want.train) and strip(got.eval) == strip(want.eval)
    assert len(got.train) == 20 and all(isinstance(s["answer"], str) for s in got.train + got.eval)


def test_json_task_that_is_not_a_list_is_refused(tmp_path):
    p = tmp_path / "d.json"
    p.write_text(json.dumps({"prompt": "a", "answer": "1"}))
    with pytest.raises(DataError, match=r"d.json: a .json dataset must be a list of objects"):
        load_task(str(p), eval_size=0)


@pytest.mark.parametrize("rows, held_out", [(1, 0), (8, 4), (10, 5), (30, 5), (60, 6), (500, 50), (5000, 200)])
def test_held_out_share_by_dataset_size(tmp_path, rows, held_out):
    """eval_prompts unset: a tenth of a dataset's rows, at least 5 and at most 200, never more than
    half; a built-in task keeps its 200."""
    from grpo.data.tasks import held_out_size

    assert held_out_size(rows) == held_out
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n" for i in range(rows)))
    if held_out < rows:
        t = load_task(str(p), eval_size=None)
        assert (len(t.eval), len(t.train)) == (held_out, rows - held_out)
    assert len(load_task("arithmetic", eval_size=None, loading=TaskLoading(max_operand=20)).eval) == 200


def test_a_dataset_without_an_answer_column_keeps_its_own(tmp_path):
    """TRL-form rewards read their columns by name: a dataset with no "answer" anywhere loads as it is;
    a row missing it while others have it, or a named answer_field that is absent, is still an error."""
    p = tmp_path / "cities.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"Where is {c}?", "city": c}) + "\n" for c in "ABCDEFGHIJ"))
    t = load_task(str(p), eval_size=2)
    assert all("answer" not in s and s["city"] in s["prompt"] for s in t.train + t.eval)
    with pytest.raises(DataError, match=r"row 1 has no field 'town'"):
        load_task(str(p), eval_size=2, loading=TaskLoading(answer_field="town"))
    p.write_text(json.dumps({"prompt": "a", "answer": "1"}) + "\n" + json.dumps({"prompt": "b"}) + "\n")
    with pytest.raises(DataError, match=r"row 2 has no field 'answer'"):
        load_task(str(p), eval_size=0)
