"""The code grader: the completion's last code block against the sample's tests, in a sandbox (the
code rewards built on it are in grpo.rewards.code_rewards).

``sample["tests"]``: Python assert statements, e.g. ``"assert f(2) == 4"``; or ``sample["io"]``:
``[{"input": str, "output": str}, ...]``. ``CodeGrader.grade`` returns the share of tests passed
(the ``code`` reward; ``code_strict`` takes 1.0 only when all pass). Missing or empty tests give
0.0, never 1.0; a malformed test raises (a counted failed reward naming the test); no code block
means the whole completion is taken as the program.

Threat model (the program is policy output optimised against this grader; assume it tries anything):
- Each test is its own sandboxed process (grpo.rewards.sandbox): the program cannot reach the network,
  the host's files, the grader's memory, other tests or other samples; whatever it forks dies with
  the run; hangs, floods and crashes end as a failed test at the wall-clock deadline.
- The verdict is decided here, outside the sandbox, from serialized output only:
  io tests compare the program's whole stdout (lines right-stripped, trailing blank lines ignored)
  with the expected output and require exit status 0; printing only the first expected line, two
  answers or exiting early all fail. Assert tests are parsed here: the sandbox evaluates the operands
  of the top-level comparison (or the asserted expression) and returns their values as plain built-in
  data; the comparison itself runs here on that data, so objects that "equal anything" never take part.
- Expected values stay outside: literal operands (``4`` in ``assert f(2) == 4``) are evaluated here and
  never sent into the sandbox, so the program cannot read them from the harness to echo them back.
- Positive evidence: an assert test passes only when exactly one line carries the run's random nonce.
  The harness forks the program's process before it reads the nonce from stdin and is non-dumpable,
  so the program can neither find the nonce in its own memory nor read it from the harness
  (ptrace, /proc/<pid>/mem and /proc/<pid>/fd are refused). ``os._exit(0)``, ``sys.exit(0)``, a crash
  or killing the harness leave no evidence line and count as failed.
- Not covered, by design of any in-process evaluation: the program and the code that evaluates the
  test share a process, so a program can write a value list of its choosing onto the result pipe and
  exit. For ``assert f(x) == literal`` it must then know the hidden literal, which is hard-coding the
  answer; for a bare ``assert is_ok(x)`` it need only write ``[True]``, and for operands that are
  not literals it can write two equal values; objects overloading arithmetic inside an operand
  (``abs(f(x) - y) < 1e-9``) are the same class of attack. Write tests as ``assert f(x) == literal``
  (the built-in ``code`` task does), or as io cases.
"""

from __future__ import annotations

import ast
import concurrent.futures as cf
import operator
import re
import secrets
import threading
import time

from grpo.errors import SandboxError
from grpo.infra.process_cache import ProcessCache
from grpo.rewards.sandbox import Sandbox

# CPython 3.11 keeps the AST constructor's recursion counter in state shared by all threads, so ast
# calls from concurrent grading threads can fail with "SystemError: AST constructor recursion depth
# mismatch" (seen in this suite on 3.11.7; python/cpython gh-106905). Every ast call here holds this lock.
AST_LOCK = threading.Lock()
CODE_BLOCK = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
OPS = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
       ast.GtE: operator.ge, ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
       ast.Is: operator.eq, ast.IsNot: operator.ne}


def extract_code(completion: str) -> str:
    """The last fenced code block (```python ... ```), else the whole completion."""
    blocks = CODE_BLOCK.findall(completion)
    return blocks[-1] if blocks else completion


def plan_assert(test: str) -> tuple[list[str], list, callable]:
    """Split one ``assert`` statement into its operands and the check applied here to their values:
    (sources of the operands the sandbox must evaluate, host values of all operands with None where the
    sandbox fills in, check). Literal operands (``4``, ``[1, 2]``, ``'abc'``) are evaluated here and
    never sent into the sandbox, so a program cannot learn the expected value from the harness.
    Raises ValueError for anything but a single assert statement."""
    try:
        with AST_LOCK:
            tree = ast.parse(test.strip())
    except SyntaxError as e:
        raise ValueError(f"code tests: {test!r} is not valid Python ({e.msg})") from None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        raise ValueError(f"code tests: {test!r} is not one assert statement")
    expr = tree.body[0].test
    if isinstance(expr, ast.Compare) and all(type(op) in OPS for op in expr.ops):
        parts = [expr.left, *expr.comparators]
        ops = [OPS[type(op)] for op in expr.ops]

        def check(v):
            return all(op(v[i], v[i + 1]) for i, op in enumerate(ops))
    elif isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        parts = [expr.operand]

        def check(v):
            return not v[0]
    else:
        parts = [expr]

        def check(v):
            return bool(v[0])
    sources, host = [], []
    with AST_LOCK:
        for p in parts:
            try:
                host.append((ast.literal_eval(p),))
            except ValueError:
                host.append(None)
                sources.append(ast.unparse(p))
    return sources, host, check
class CodeGrader:
    """Grades programs in a Sandbox; thread-safe; ``check()`` at start-up refuses to run without one."""

    def __init__(self, *, test_timeout: float = 5.0, program_timeout: float = 8.0, slots: int | None = None,
                 **limits):
        # a step's tests run concurrently up to this machine's cores (past them they only queue)
        slots = slots or available_cores()
        self.test_timeout, self.program_timeout, self.slots = test_timeout, program_timeout, slots
        self.sandbox = Sandbox(slots=slots, **limits)
        self._pool = cf.ThreadPoolExecutor(slots)

    def check(self) -> None:
        self.sandbox.check()

    def run_assert(self, code: str, test: str, timeout: float) -> bool:
        exprs, host, decide = plan_assert(test)
        nonce = secrets.token_hex(16)
        res = self.sandbox.run({"solution.py": code, "test.json": _json(exprs)}, ["assert"], timeout=timeout,
                               stdin_data=nonce + "\n")
        lines = [ln for ln in res.stdout.splitlines() if ln.startswith(nonce + " ")]
        if res.timed_out or res.truncated or len(lines) != 1:
            return False  # no evidence (or more than the one line the harness writes)
        payload = lines[0][len(nonce) + 1:]
        if payload.startswith("!"):
            return False
        try:
            with AST_LOCK:
                parsed = ast.literal_eval(payload)
            got = iter(parsed)
            values = [h[0] if h is not None else next(got) for h in host]
            if next(got, _END) is not _END:
                return False  # more values than asked for
            return bool(decide(values))
        except Exception:  # unparsable, too few or incomparable values: the test did not pass
            return False

    def run_io(self, code: str, case: dict, timeout: float) -> bool:
        import os
        import tempfile

        with tempfile.NamedTemporaryFile("w", prefix="grpo-stdin-", delete=False) as f:
            f.write(str(case["input"]))
        try:
            res = self.sandbox.run({"solution.py": code}, ["io"], timeout=timeout, stdin_path=f.name)
        finally:
            os.unlink(f.name)
        return (not res.timed_out and not res.truncated and res.exit_code == 0
                and _norm(res.stdout) == _norm(str(case["output"])))

    def grade(self, completion: str, sample: dict) -> float:
        """Share of the sample's tests passed (tests run concurrently, each under its own deadline,
        all under ``program_timeout``)."""
        self.check()
        tests, io = sample.get("tests"), sample.get("io")
        if not tests and not io:
            return 0.0  # nothing shows the program works: never a free 1.0
        code = extract_code(completion)
        if not _parses(code):
            return 0.0  # fails every test; no need to start a sandbox to find out
        if tests:
            for t in tests:
                plan_assert(t)  # a malformed test is the dataset's error, raised before anything runs
            jobs = [(self.run_assert, t) for t in tests]
        else:
            for i, case in enumerate(io):
                if not isinstance(case, dict) or "input" not in case or "output" not in case:
                    raise ValueError(f"code reward: io case {i} needs 'input' and 'output'")
            jobs = [(self.run_io, c) for c in io]
        # the program's clock starts when its first test starts, not when its tests are queued: a
        # step's hostile programs holding every slot must not eat the time of the correct ones
        clock = _ProgramClock(self.program_timeout)
        futures = [self._pool.submit(_before, clock, fn, code, arg, self.test_timeout) for fn, arg in jobs]
        passed = sum(bool(f.result()) for f in futures)
        return passed / len(jobs)


_END = object()


def available_cores() -> int:
    """CPU cores this process may run on (its affinity), at least 1."""
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _parses(code: str) -> bool:
    """Whether the program is syntactically Python. ast.parse only builds a tree (no constant folding,
    nothing runs); pathological nesting raises and counts as not parsing."""
    try:
        with AST_LOCK:
            ast.parse(code)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False


class _ProgramClock:
    """One program's wall-clock budget over all its tests, started by the first test to run."""

    def __init__(self, budget: float):
        self.budget, self.deadline, self.lock = budget, None, threading.Lock()

    def left(self) -> float:
        with self.lock:
            if self.deadline is None:
                self.deadline = time.monotonic() + self.budget
            return self.deadline - time.monotonic()


def _before(clock: _ProgramClock, fn, code: str, arg, test_timeout: float) -> bool:
    left = clock.left()
    return fn(code, arg, min(test_timeout, left)) if left > 0.05 else False


def _json(obj) -> str:
    import json

    return json.dumps(obj)


def _norm(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()).rstrip()


GRADERS = ProcessCache("the code rewards' sandboxed grader (key 'default')",
                       stale_when="never within a process: its sandbox is checked once, when it is made")


def default_grader() -> CodeGrader:
    """The process-wide grader behind the code rewards; its sandbox is checked when it is created."""
    def make() -> CodeGrader:
        grader = CodeGrader()
        grader.check()
        return grader

    return GRADERS.get_or_make("default", make)


def grade_batch(grader: CodeGrader, completions: list[str], samples: list[dict], *, strict: bool) -> list:
    """The step's completions graded concurrently on ``grader`` (their tests share its slots): each
    one's share of tests passed (``strict``: 1.0 when all pass, else 0.0); a sample whose grading
    raised gets its exception in its place (one counted failure, not the batch's)."""
    def one(pair):
        try:
            score = grader.grade(*pair)
            return float(score == 1.0) if strict else score
        except Exception as e:
            return e

    with cf.ThreadPoolExecutor(max(1, min(len(completions), 16))) as ex:  # these threads only wait
        return list(ex.map(one, zip(completions, samples)))


def program_parses(completion: str, sample: dict) -> bool:
    """Whether the completion's program is syntactically Python: the code rewards' validity check, by
    which resample_invalid_rounds samples unparsable programs again (seed 003 section 5.1)."""
    return _parses(extract_code(completion))


__all__ = ["CodeGrader", "GRADERS", "SandboxError", "default_grader", "extract_code", "grade_batch", "plan_assert",
           "program_parses"]
