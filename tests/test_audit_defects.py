"""The logic-breakpoint detector and the audit's four defect detectors, by hand on written examples:
one per defect kind, in English and in Chinese, each with the findings written out."""

import pytest

from grpo.audit.defects import KINDS, audit_completion, parse_steps
from grpo.data.logic import breakpoints, arithmetic_value, find_connectives, find_equations, logical_steps

CLEAN_EN = ("Tom has 13 apples, buys 14 more, then 25 more.",
            "Step 1: 13 + 14 = 27\nStep 2: 27 + 25 = 52\nAnswer: 52")
CLEAN_ZH = ("小明有13个苹果，又买了14个，又买了25个。",
            "第一步：13 + 14 = 27\n第二步：27 + 25 = 52\n答案：52")

# (problem, completion, the findings' details) per kind and language; every other kind must stay 0
EXAMPLES = {
    ("completeness", "en"): ("Tom has 13 apples, buys 14 more, then 25 more.",
                             "Step 1: 13 + 14 = 27\nStep 3: 42 + 25 = 67\nAnswer: 67",
                             ["step 2 is missing", "uses 42, which no step derives"]),
    ("completeness", "zh"): ("小明有13个苹果，又买了14个，又买了25个。",
                             "第一步：13 + 14 = 27\n第二步：27 + 25 = 52\n因此",
                             ["nothing follows '因此'", "no final answer"]),
    ("order", "en"): ("Tom has 13 apples, buys 14 more, then 25 more.",
                      "Step 2: 27 + 25 = 52\nStep 1: 13 + 14 = 27\nAnswer: 52",
                      ["step 1 comes after step 2", "uses 27 before step 1 derives it"]),
    ("order", "zh"): ("小明有13个苹果，又买了14个，又买了25个。",
                      "第一步：27 + 25 = 52\n第二步：13 + 14 = 27\n答案：52",
                      ["uses 27 before step 2 derives it"]),
    ("symbols", "en"): ("A pen costs 15 dollars and a book 3 dollars more.",
                        "Step 1: Let p be the pen's price. p = 15\nStep 2: q + 3 = 18\nStep 3: p = 20\nAnswer: 18",
                        ["q is used but never defined", "p = 20 here but 15 in step 1"]),
    ("symbols", "zh"): ("一支笔15元，一本书比笔贵3元。",
                        "第一步：设x为笔的价格，x = 15\n第二步：y = x + 3 = 18\n第三步：x = 16\n答案：18",
                        ["x = 16 here but 15 in step 1"]),
    ("calculation", "en"): ("Tom has 13 apples, buys 14 more, then 25 more.",
                            "Step 1: 13 + 14 = 28\nStep 2: 28 + 25 = 53\nAnswer: 53",
                            ["13 + 14 = 28 is false (13 + 14 = 27)"]),
    ("calculation", "zh"): ("小明有13个苹果，每个3元。",
                            "第一步：13 × 3 = 36\n答案：36",
                            ["13 × 3 = 36 is false (13 × 3 = 39)"]),
}


@pytest.mark.parametrize("clean", [CLEAN_EN, CLEAN_ZH], ids=["en", "zh"])
def test_a_clean_answer_has_no_findings(clean):
    problem, completion = clean
    a = audit_completion(completion, problem)
    assert a.findings == []
    assert [s.number for s in a.steps] == [1, 2] and a.final_answer == "52" and a.equations_checked == 2


@pytest.mark.parametrize("kind,lang", sorted(EXAMPLES), ids=lambda v: str(v))
def test_each_defect_kind_by_hand(kind, lang):
    problem, completion, details = EXAMPLES[(kind, lang)]
    a = audit_completion(completion, problem)
    assert [f.detail for f in a.findings] == details
    counts = a.counts()
    assert counts[kind] == len(details)
    assert all(counts[k] == 0 for k in KINDS if k != kind), counts


def test_steps_chinese_numerals_and_continuations():
    steps, final = parse_steps("先看题目。\n第十二步：a\n继续\n步骤13：b\n#### 7")
    assert [(s.number, s.text) for s in steps] == [(None, "先看题目。"), (12, "a 继续"), (13, "b")]
    assert final == "7"


def test_connectives_and_their_following_step():
    text = "From x + 2 = 5 we get x = 3. Therefore, y = 6; hence done. So\n2 + 2 = 5."
    got = [(c.word, c.following) for c in find_connectives(text)]
    assert got == [("we get", "x = 3"), ("Therefore", "y = 6"), ("hence", "done"), ("So", "2 + 2 = 5")]
    zh = "由 2x = 10 得 x = 5。因此 y = 2。这是一个故事，故 z = 1。"
    assert [(c.word, c.following) for c in find_connectives(zh)] == [
        ("由…得", "x = 5"), ("因此", "y = 2"), ("故", "z = 1")]  # 故事 is a noun, not an inference
    assert [(b.connective.word, b.reason) for b in breakpoints(text)] == [("So", "false")]
    assert [(b.connective.word, b.reason) for b in breakpoints("因此")] == [("因此", "empty")]


def test_equations_sides_and_values():
    eqs = find_equations("The total is 3 x 4 = 12, and 2*(3+4) = 15. So a = b = 3. She paid $1,200 = 1200.")
    assert [(e.lhs, e.rhs, e.value_ok) for e in eqs] == [
        ("3 x 4", "12", True), ("2*(3+4)", "15", False), ("a", "b", None), ("b", "3", None),
        ("$1,200", "1200", True)]
    assert [(e.lhs, e.rhs) for e in find_equations("48/2 = <<48/2=24>>24 clips")] == [("48/2", "24")]
    assert arithmetic_value("2^10 ÷ 4") == 256 and arithmetic_value("1/0") is None
    assert arithmetic_value("x + 1") is None and arithmetic_value("9**99999") is None


def test_logical_steps_counts_derivations():
    gsm = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
           "Natalia sold 48+24 = <<48+24=72>>72 clips altogether.\n#### 72")
    assert logical_steps(gsm) == 2
    assert logical_steps("由A得B，由B及C故D成立。因此 E。所以 F。") == 3
    assert logical_steps("What is Python?") == 0
