"""Tests generated from a reference solution (seed 003 section 5.1), graded in the code sandbox."""

from __future__ import annotations


import pytest

from grpo.data.tasks import code_task
from grpo.rewards import code, code_rewards
from grpo.rewards.code import CodeGrader
from grpo.rewards.generated_tests import SPECIAL, CaseGenerator, draw_cases, signature, with_generated_tests

from tests.conftest import need_bwrap, needs_bwrap


def test_signature_and_the_kinds_of_case_by_hand():
    assert signature(["assert f(0) == 3", "assert f(3) == 6"]) == ("f", [int])
    assert signature(["assert g('ab', [1, 2]) == 3"]) == ("g", [str, [int]])
    assert signature(["assert f(x) == 3"]) is None  # not a literal: no signature to draw from
    ints = draw_cases([int], n=10, seed="p")
    assert len(set(ints)) == 10 and (0,) in ints and {(10**12,), (-10**12,)} & set(ints)
    assert all(type(c[0]) is int for c in ints)  # no special-character case for an int argument
    strs = draw_cases([str], n=10, seed="p")
    assert ("",) in strs and ("ab" * 5000,) in strs
    assert sum(c[0] in SPECIAL for c in strs) >= 2  # the special-character cases
    lists = draw_cases([[int]], n=10, seed="p")
    assert ([],) in lists and any(len(c[0]) == 1000 for c in lists)
    assert draw_cases([int], n=10, seed="p") == ints  # seeded by the problem


@pytest.fixture(scope="module")
def grader():
    need_bwrap()
    g = CodeGrader(test_timeout=5.0, program_timeout=30.0, slots=2)  # generous: the machine may be busy
    g.check()
    return g


@needs_bwrap
def test_generated_tests_are_the_references_values_and_catch_a_lookup_table(grader, monkeypatch):
    sample = code_task(eval_size=0, seed=0).train[0]  # f(x) = <expr of x>; tests at 0, 3, 10, -4
    gen = CaseGenerator(grader)
    made = gen.tests_for(sample)
    assert len(made) == 10
    ref = {}
    exec(sample["answer"], ref)  # the built-in task's reference, trusted here to check the sandbox's values
    for t in made:
        call, want = t[len("assert "):].split(" == ")
        assert eval(want) == eval(call, dict(ref))
    assert gen.tests_for(sample) is made  # computed once per problem
    # a program that memorised the given tests passes them all and few generated ones
    given = {int(t.split("(")[1].split(")")[0]): t.split(" == ")[1] for t in sample["tests"]}
    table = "def f(x):\n    return {" + ", ".join(f"{k}: {v}" for k, v in given.items()) + "}.get(x, 0)\n"
    monkeypatch.setitem(code.GRADERS, "default", grader)
    plain = code_rewards.code_batch_reward([table], [sample])
    extended = with_generated_tests([sample, sample], gen)
    assert len(extended[0]["tests"]) == 14
    scored = code_rewards.code_batch_reward([table, sample["answer"]], extended)
    assert plain == [1.0] and scored[1] == 1.0 and scored[0] <= 6 / 14


@needs_bwrap
def test_hostile_programs_and_references(grader, monkeypatch):
    sample = {"answer": "def f(s):\n    return s[0]\n", "tests": ["assert f('ab') == 'a'"]}
    gen = CaseGenerator(grader, n=5, timeout=1.0)  # four normal cases and the empty one (fewer runs)
    made = gen.tests_for(sample)
    # the reference raises on the empty string: that case is dropped, the others kept
    assert len(made) == 4 and not any("f('')" in t for t in made)
    hostile_ref = {"answer": "def f(x):\n    while True:\n        pass\n", "tests": ["assert f(1) == 1"]}
    hangs = CaseGenerator(grader, n=2, timeout=0.5)
    assert hangs.tests_for(hostile_ref) == []  # a reference that hangs yields no test, and the run goes on
    monkeypatch.setitem(code.GRADERS, "default", grader)
    extended = with_generated_tests([sample], gen)
    hostile = [  # programs written without the reference, against the generated tests
        "class A(str):\n    def __eq__(self, o):\n        return True\ndef f(s):\n    return A()\n",
        "import os\ndef f(s):\n    os._exit(0)\n",
        "def f(s):\n    import sys\n    return sys.stdin.read()\n",
        "def f(s):\n    return open('/work/test.json').read()\n",
    ]
    assert code_rewards.code_batch_reward(hostile, extended * len(hostile)) == [0.0] * len(hostile)


@needs_bwrap
def test_the_remote_grading_service_grades_as_the_local_grader(grader, monkeypatch):
    import threading

    from grpo.errors import SandboxError
    from grpo.rewards import grading_service

    server = grading_service.make_server("127.0.0.1", 0, grader)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        good = {"tests": ["assert f(2) == 4", "assert f(5) == 10"]}
        bad_test = {"tests": ["f(2) == 4"]}  # not an assert: that sample's grading raises
        completions = ["def f(x):\n    return 2 * x\n", "def f(x):\n    return 4\n", "def f(x):\n    return x\n"]
        samples = [good, good, bad_test]
        monkeypatch.setitem(code.GRADERS, "default", grader)
        local = code_rewards.code_batch_reward(completions, samples)
        monkeypatch.setenv("GRPO_CODE_GRADER_URL", f"{url},{url}")  # two services: two shares
        code_rewards.check_code_sandbox()
        remote = code_rewards.code_batch_reward(completions, samples)
        assert remote[:2] == local[:2] == [1.0, 0.5]
        assert isinstance(local[2], ValueError) and isinstance(remote[2], ValueError)
        assert code_rewards.code_strict_batch_reward(completions[:2], samples[:2]) == [1.0, 0.0]
    finally:
        server.shutdown()
        server.server_close()
    monkeypatch.setenv("GRPO_CODE_GRADER_URL", url)  # the service is gone: the start-up check says so
    with pytest.raises(SandboxError, match="grading service"):
        code_rewards.check_code_sandbox()
    assert all(isinstance(x, RuntimeError) for x in code_rewards.code_batch_reward(completions[:1], samples[:1]))
