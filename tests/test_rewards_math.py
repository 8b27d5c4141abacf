"""grpo.rewards.mathverify: math-verify equivalence under a hard deadline, hedges scoring 0."""

import concurrent.futures as cf
import os
import time

import pytest

from grpo.rewards import math_reward
from grpo.rewards import mathverify
from grpo.rewards.mathverify import MathVerifier, all_boxed, candidates, gold_answer

# The public example of math-verify's README (gold first: the order matters there).
def _plain(row) -> bool:
    """Rows whose gold and answers are plain numbers (no LaTeX beyond boxes, $ and %)."""
    completion, gold, _ = row
    return "\\frac" not in completion + gold and "sqrt" not in completion + gold and "pi" not in completion + gold \
        and "x" not in completion and "(" not in gold and "/" not in gold


README_CASES = [
    ("${1,2,3,4}$", "${1,3} \\cup {2,4}$", 1.0),
]

# (completion, gold, expected reward): the adversarial table of the issue and beyond.
TABLE = [
    # GSM8K gold after ####, completion's last box / last number
    ("so she has \\boxed{72}", "48 + 24 = 72 #### 72", 1.0),
    ("so she has 72 clips.", "#### 72", 1.0),
    ("first 3, then 5, in the end 72", "72", 1.0),
    ("first 72, in the end 5", "72", 0.0),  # the LAST number counts
    # thousands separators
    ("The total is 1,234 dollars", "1234", 1.0),
    ("\\boxed{1,234}", "#### 1,234", 1.0),
    ("The total is 7,2", "72", 0.0),  # '7,2' is two numbers, not 72
    ("\\boxed{7,2}", "72", 0.0),
    ("\\boxed{72.00}", "72", 1.0),
    ("that is $72.00.", "72", 1.0),
    ("\\boxed{\\$1,000}", "1000", 1.0),
    ("\\boxed{72.5}", "72", 0.0),
    # hedges
    ("\\boxed{}", "42", 0.0),
    ("\\boxed{42} or maybe \\boxed{43}", "42", 0.0),
    ("\\boxed{43} hmm \\boxed{42}", "42", 0.0),  # the last box is right, but the first is not
    ("\\boxed{42} so again \\boxed{42}", "42", 1.0),  # repeating the same value is not a hedge
    ("\\boxed{0.5} i.e. \\boxed{\\frac{1}{2}}", "1/2", 1.0),
    ("The answer is 42 or 43", "43", 0.0),
    ("The answer is 42 or 43", "42", 0.0),
    ("\\boxed{42 \\text{ or } 43}", "42", 0.0),
    ("\\boxed{42, 43}", "42", 0.0),
    ("\\boxed{\\{41, 42, 43\\}}", "42", 0.0),
    ("\\boxed{[40, 50]}", "42", 0.0),
    ("\\boxed{(0, \\infty)}", "42", 0.0),
    ("\\boxed{x \\le 50}", "42", 0.0),
    ("\\boxed{42 \\pm 1}", "42", 0.0),
    ("no number at all", "3", 0.0),
    ("", "3", 0.0),
    ("\\boxed{42", "42", 1.0),  # an unclosed box is no box: the last number, 42, is the answer
    # LaTeX equivalence (math-verify)
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("so the result is $\\frac{1}{2}$", "0.5", 1.0),
    ("\\boxed{\\frac{1}{3}}", "0.5", 0.0),
    ("\\boxed{2}", "\\sqrt{4}", 1.0),
    ("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt{2}}{2}", 1.0),
    ("\\boxed{\\frac{\\pi}{2}}", "\\pi/2", 1.0),
    ("\\boxed{x^2 + 2x + 1}", "(x+1)^2", 1.0),
    ("\\boxed{(1, 2)}", "(1,2)", 1.0),  # gold is an interval/tuple: lists are allowed then
    ("\\boxed{\\left(\\frac{1}{2}\\right)}", "0.5", 1.0),  # \\left is not \\le
    ("\\boxed{40 \\leq x \\leq 50}", "42", 0.0),
    ("\\boxed{41 \\ldots 43}", "42", 0.0),
    # found in review: set-valued boxes math-verify matches by any member, and hedges outside the last line
    ("\\boxed{42 \\vee 43}", "43", 0.0),
    ("\\boxed{42 \\wedge 43}", "43", 0.0),
    ("\\boxed{42 \\mid 43}", "43", 0.0),
    ("\\boxed{42 \\& 43}", "43", 0.0),
    ("\\boxed{42 | 43}", "43", 0.0),
    ("\\boxed{x = 42 \\vee x = 43}", "43", 0.0),
    ("The answer is 42 or 43.\n\nDone.", "43", 0.0),
    ("41, 42, 43", "43", 0.0),
    ("It is between 40 and 50", "50", 0.0),
    ("The answer is 7,2", "2", 0.0),
    ("\\boxed{43\\%}", "43", 1.0),
    ("\\boxed{x = 43}", "43", 1.0),
    ("The sum of 3 and 4 is 7.", "7", 1.0),  # only the last two numbers decide a hedge
    ("10 - 3 = 7", "7", 1.0),
]


@pytest.mark.parametrize("pred,gold,expected", README_CASES)
def test_math_verify_readme_cases(pred, gold, expected):
    assert math_reward(pred, {"answer": gold}) == expected


@pytest.mark.parametrize("completion,gold,expected", TABLE)
def test_adversarial_table(completion, gold, expected):
    assert math_reward(completion, {"answer": gold}) == expected


@pytest.mark.parametrize("completion,gold,expected", [row for row in TABLE if _plain(row)])
def test_numeric_reward_follows_the_same_hedge_rules(completion, gold, expected):
    """The default reward compares plain numbers only, but hedges score 0 there too."""
    from grpo.rewards.builtin import numeric_reward

    assert numeric_reward(completion, {"answer": gold}) == expected


def test_answer_extraction_pieces():
    assert all_boxed("a \\boxed{1} b \\fbox{2} c \\boxed{\\frac{3}{4}}") == ["1", "2", "\\frac{3}{4}"]
    assert all_boxed("so \\boxed{1 hmm wait. Final: \\boxed{2}") == ["2"]  # an unclosed box is skipped
    assert all_boxed("\\boxed{3") == []
    assert gold_answer("3 + 4 = 7\n#### 1,234") == "1234"
    assert candidates("\\boxed{ }", "4") is None
    assert candidates("it is 7", "7") == ["7"]


def test_empty_gold_is_an_error_not_a_score():
    with pytest.raises(ValueError, match="answer"):
        math_reward("\\boxed{1}", {"answer": ""})


def test_hang_is_killed_at_the_deadline_counted_and_the_next_call_graded():
    v = MathVerifier(timeout=2.0, workers=1)
    try:
        start = time.monotonic()
        assert v("5", ["9^{9^{9^{9}}}"]) is None  # sympy would evaluate this tower for ever
        # deadline 2 s plus killing and reading, far below the hours the tower would take
        assert time.monotonic() - start < 60
        assert v.timeouts == 1
        assert v("1/2", ["\\frac{1}{2}"]) == 1.0  # a fresh worker grades the next sample
        assert v("1/2", ["\\frac{1}{3}"]) == 0.0
    finally:
        v.close()


def test_math_reward_fails_the_sample_on_a_hang(monkeypatch):
    """A verdict past the deadline is a failure of that sample (TimeoutError), not None, which would
    mean 'not applicable to this row' and leave the row to the other rewards."""
    v = MathVerifier(timeout=2.0, workers=1)
    monkeypatch.setitem(mathverify.VERIFIERS, "default", v)
    try:
        with pytest.raises(TimeoutError, match="no verdict within its 2 s deadline"):
            math_reward("\\boxed{9^{9^{9^{9}}}}", {"answer": "5"})
        assert v.timeouts == 1
    finally:
        v.close()


def test_works_from_threads_same_answers_as_main_thread():
    """math-verify's own SIGALRM timeout breaks off the main thread; ours does not."""
    cases = [(c, g) for c, g, _ in TABLE[:12]] + [("\\boxed{\\frac{1}{2}}", "0.5"), ("\\boxed{\\frac{1}{3}}", "0.5")]
    main = [math_reward(c, {"answer": g}) for c, g in cases]
    with cf.ThreadPoolExecutor(4) as ex:
        threaded = list(ex.map(lambda cg: math_reward(cg[0], {"answer": cg[1]}), cases))
    assert threaded == main
    assert None not in threaded


def test_close_leaves_no_worker_processes():
    v = MathVerifier(timeout=10.0, workers=2)
    assert v("0.5", ["\\frac{1}{2}"]) == 1.0
    pids = [w.proc.pid for w in v._idle]
    v.close()
    assert pids and not any(os.path.exists(f"/proc/{p}") and _state(p) != "Z" for p in pids)


def _state(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_a_worker_dies_with_the_process_that_started_it(tmp_path):
    """A parent killed mid-call (as the reward runner kills a stuck reward process) takes its math-verify
    worker along instead of leaving it computing a power tower for ever."""
    import signal
    import subprocess
    import sys

    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, threading\n"
        "from grpo.rewards.mathverify import MathVerifier\n"
        "v = MathVerifier(timeout=600, workers=1)\n"
        "w = v._checkout()\n"
        "print(w.proc.pid, flush=True)\n"
        "w.ask('5', ['9^{9^{9^{9}}}'], 600)\n")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
    worker = int(parent.stdout.readline())
    time.sleep(1.0)  # the worker is now inside the tower
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    for _ in range(100):
        if not os.path.exists(f"/proc/{worker}") or _state(worker) in ("Z", "gone"):
            break
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{worker}") or _state(worker) in ("Z", "gone")
