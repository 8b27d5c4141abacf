"""Answer extraction and the built-in rewards."""

import pytest

from grpo.config import ConfigError
from grpo.rewards import extract_answer, math_reward, numeric_reward, parse_number, resolve_reward
from grpo.rewards import score_completions
from grpo.rewards.builtin import REWARDS, stated_answer_reward


@pytest.mark.parametrize("text, expected", [
    ("The answer is 72.", "72"),
    ("12 + 25 = 37.", "37"),
    ("7,2", "2"),  # not a thousands separator: 7 and 2
    ("about 1,234 apples", "1,234"),
    ("\\boxed{42} and later 7", "42"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("no number here", None),
    ("-5 then -3.5", "-3.5"),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text, value", [("1,234", 1234.0), ("72.00", 72.0), ("$5", 5.0), ("7,2", None),
                                         ("abc", None), ("-3", -3.0)])
def test_parse_number(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize("completion, gold, reward", [
    ("12 + 25 = 37.", "37", 1.0), ("It is 72.00", "72", 1.0), ("1,234", "1234", 1.0), ("7,2", "72", 0.0),
    ("37 or maybe 38", "37", 0.0), ("", "3", 0.0),
])
def test_numeric_reward(completion, gold, reward):
    assert numeric_reward(completion, {"answer": gold}) == reward


@pytest.mark.parametrize("completion,stated", [
    ("7 + 5 = 12", True), ("7 + 5 = 13.", True),  # stated, right or wrong
    ("The sum is 12.", True), ("12", True), ("\\boxed{12}", True), ("#### 12", True),
    ("8 + 1 = 1 + 2", False), ("2 + 10 = 2 + 10", False),  # an equation with no result
    ("7 + 5", False), ("It is 12 or 13.", False), ("Let me think.", False), ("", False),
])
def test_stated_answer_reward_by_hand(completion, stated):
    assert stated_answer_reward(completion, {"answer": "12"}) == (0.1 if stated else 0.0)


def test_the_arithmetic_task_is_scored_by_its_answer_and_a_tenth_for_stating_one(tmp_path):
    from grpo.api import _rewards_follow_task
    from grpo.config import Config

    c = Config()
    assert (c.task, c.rewards, c.reward_weights) == ("arithmetic", "numeric,stated_answer", None)
    fns = {n: REWARDS[n] for n in c.reward_names}
    res = score_completions(["7 + 5 = 12", "7 + 5 = 13", "7 + 5 = 5 + 7"], [{"answer": "12"}] * 3, fns, None)
    assert res.total.tolist() == pytest.approx([1.1, 0.1, 0.0])  # right > stated but wrong > no result
    # a dataset handed to the API is scored with a dataset's rewards, not the default task's it replaces
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "What is 1 + 1?", "answer": "2"}\n' * 4)
    assert Config(**{**vars(c), **_rewards_follow_task(c, {"task": str(rows)})}).rewards == "numeric"
    assert _rewards_follow_task(Config(rewards="length"), {"task": str(rows)}) == {"task": str(rows)}  # the user's


def test_math_reward_equivalence():
    assert math_reward("so the result is $\\frac{1}{2}$", {"answer": "0.5"}) == 1.0
    assert math_reward("so the result is $\\frac{1}{3}$", {"answer": "0.5"}) == 0.0


def test_resolve_reward_errors_list_builtins():
    with pytest.raises(ConfigError) as err:  # an unknown name lists every built-in
        resolve_reward("nope")
    assert str(err.value) == f"rewards: unknown reward 'nope'; valid: {', '.join(REWARDS)}, or a module:function path"
    assert {"numeric", "math", "format", "code"} <= set(REWARDS)
    with pytest.raises(ConfigError, match=r"^rewards: cannot load 'no.such.module:fn': No module named 'no'$"):
        resolve_reward("no.such.module:fn")
    with pytest.raises(ConfigError, match=r"^rewards: cannot load 'tests.rewards_for_tests:nofn': module "
                                          r"'tests.rewards_for_tests' has no attribute 'nofn'$"):
        resolve_reward("tests.rewards_for_tests:nofn")
    assert resolve_reward("tests.rewards_for_tests:digit_share")("a1", {}) == 0.5


def test_weighted_scores_and_failures():
    fns = {"numeric": numeric_reward, "bad": resolve_reward("tests.rewards_for_tests:always_raises")}
    res = score_completions(["3", "4"], [{"answer": "3"}, {"answer": "3"}], {"numeric": numeric_reward},
                            [2.0])
    assert res.total.tolist() == [2.0, 0.0]
    res = score_completions(["3", "4"], [{"answer": "3"}] * 2, fns)
    assert res.failures == {"numeric": 0, "bad": 2} and res.failed.all()
    assert len(res.messages) == 1  # logged once per kind, with the sample


@pytest.mark.parametrize("text,expected", [
    ("Step 1: 2 + 3 = 5\nStep 2: 5 * 2 = 10\nSo \\boxed{10}", 0.0),  # numbered, balanced, paired, no dangling
    ("2 + 3 = 5\n5 * 2 = 10", 0.25),  # two lines, no numbering
    ("1. (2 + 3 = 5\n2. done", 0.25),  # an unclosed bracket
    ("1. $x = 2\n2. ok", 0.25),  # an unpaired $
    ("1. 2 + 3 =\n2. ok", 0.25),  # a dangling '='
    ("(2 + 3 = $\n] 5 *", 1.0),  # all four fail
    ("42", 0.0),  # one line needs no numbering
])
def test_incompleteness_shaping_by_hand(text, expected):
    from grpo.rewards.builtin import incompleteness_reward

    assert incompleteness_reward(text, {}) == expected


def test_incompleteness_subtracts_lambda_times_from_the_outcome():
    from grpo.rewards import score_completions
    from grpo.rewards.builtin import REWARDS

    fns = {"numeric": REWARDS["numeric"], "incompleteness": REWARDS["incompleteness"]}
    res = score_completions(["(so 7", "Step 1: 3 + 4 = 7"], [{"answer": "7"}] * 2, fns, [1.0, -0.1])
    # first: right (1.0) with an unclosed bracket (0.25): 1 - 0.1 * 0.25 = 0.975; second complete: 1.0
    assert res.total.tolist() == pytest.approx([0.975, 1.0])


@pytest.mark.parametrize("text,expected", [
    ("第一步：2 + 3 = 5。\n第二步：5 × 2 = 10。\n因此答案是 $10$。", 0.0),  # every marker, paired $
    ("第一步：设 $x = 2$。第二步：求得 \\(x^2 = 4\\)。综上，答案为 4。", 0.0),  # one line, several sentences
    ("2 + 3 = 5。\n5 × 2 = 10。\n因此答案是 10。", 0.2),  # several sentences without step markers
    ("第二步：5 × 2 = 10。\n第一步：2 + 3 = 5。\n因此 10。", 0.2),  # the markers out of order
    ("第一步：2 + 3 = 5。\n第二步：5 × 2 = 10。", 0.2),  # no conclusion (因此 / 综上)
    ("第一步：（2 + 3 = 5。\n第二步：10。因此 10。", 0.2),  # an unclosed full-width bracket
    ("第一步：\\[ \\sum_{i=1}^{n} i \\]。\n第二步：\\begin{cases} x \\end{align}。因此 1。", 0.2),  # environments cross
    ("第一步：5 × 2 =\n第二步：10。因此 10。", 0.2),  # a dangling '='
    ("（答案 $x \\( 10 =\n再算", 1.0),  # all five fail
    ("42", 0.2),  # one sentence needs no steps, but a conclusion marker
])
def test_incompleteness_chinese_markers_by_hand(text, expected):
    from grpo.rewards.builtin import REWARDS

    assert REWARDS["incompleteness_zh"](text, {}) == pytest.approx(expected)


def test_incompleteness_languages_differ_and_an_unknown_one_is_refused():
    from grpo.rewards.completeness import incompleteness

    zh = "第一步：2 + 3 = 5。\n第二步：5 × 2 = 10。\n因此答案是 10。"
    assert incompleteness(zh, language="zh") == 0.0
    assert incompleteness(zh, language="en") == 0.25  # the English checks want numbered lines
    assert incompleteness("Step 1: 1 + 1 = 2\nStep 2: so 2", language="zh") == pytest.approx(0.4)
    with pytest.raises(ValueError, match="valid"):
        incompleteness("x", language="fr")


def test_seed_shaping_lambda_03_on_the_chinese_markers():
    from grpo.rewards import score_completions
    from grpo.rewards.builtin import REWARDS

    fns = {"numeric": REWARDS["numeric"], "incompleteness_zh": REWARDS["incompleteness_zh"]}
    texts = ["第一步：3 + 4 = 7。\n第二步：检查。\n因此 7", "7"]
    res = score_completions(texts, [{"answer": "7"}] * 2, fns, [1.0, -0.3])
    # r_final = r_raw - 0.3 * (1 - completeness): complete -> 1.0; "7" lacks only the conclusion -> 1 - 0.3 * 0.2
    assert res.total.tolist() == pytest.approx([1.0, 0.94])
