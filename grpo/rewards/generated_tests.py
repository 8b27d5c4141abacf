"""Tests generated from a reference solution (seed 003 section 5.1: ten extra cases per problem, normal,
empty, large and special-character inputs), graded in the same sandbox as the given tests.

The signature comes from the sample's own ``assert f(args) == value`` tests: the called function's
name and each argument's type (int, float, str, bool, or a list of one of them). Cases of that shape
are drawn (a seeded generator per problem): normal values around the given ones, the type's empty
value, large values, and for string arguments special characters (quotes, escapes, non-ASCII,
control characters); a kind the signature does not allow (special characters into an int) is filled
with normal cases. The expected values are the reference's own, computed by running the reference in
the sandbox (a reference is data, so it runs as untrusted as any completion); a case on which the
reference raises, hangs, or returns something that is not plain built-in data is dropped. The tests
are then plain ``assert f(args) == literal`` statements, graded like any other (the literal never
enters the sandbox).
"""

from __future__ import annotations

import ast
import concurrent.futures as cf
import hashlib
import random
import secrets
import threading

from grpo.infra.process_cache import ProcessCache
from grpo.rewards.code import AST_LOCK, CodeGrader, default_grader, extract_code
from grpo.rewards.code_rewards import code_batch_reward

KINDS = ("normal", "normal", "normal", "normal", "empty", "empty", "large", "large", "special", "special")
SPECIAL = ["", " ", "\n\t", "'\"\\", "ñandú", "日本語", "😀 emoji", "a\x00b", "<>&;|$`", "  padded  "]
SCALARS = (int, float, str, bool)


def signature(tests: list[str]) -> tuple[str, list] | None:
    """(function name, argument types) from the first ``assert name(literal, ...) == ...`` test; a type
    is a scalar type or ``[element type]``; None when no test has that shape."""
    for test in tests:
        try:
            with AST_LOCK:
                expr = ast.parse(test.strip()).body[0].test
                call = expr.left if isinstance(expr, ast.Compare) else None
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and not call.keywords):
                    continue
                args = [ast.literal_eval(a) for a in call.args]
        except (SyntaxError, ValueError, IndexError, AttributeError):
            continue
        types = [_type_of(a) for a in args]
        if args and all(t is not None for t in types):
            return call.func.id, types
    return None


def _type_of(value):
    if type(value) in SCALARS:
        return type(value)
    if type(value) is list and value and len({type(v) for v in value}) == 1 and type(value[0]) in SCALARS:
        return [type(value[0])]
    return None


def _value(t, kind: str, rng: random.Random):
    if isinstance(t, list):
        n = {"empty": 0, "large": 1000}.get(kind, rng.randint(1, 6))
        return [_value(t[0], "special" if kind == "special" else "normal", rng) for _ in range(n)]
    if t is bool:
        return rng.random() < 0.5
    if t is str:
        if kind == "special":
            return rng.choice(SPECIAL[1:])
        return {"empty": "", "large": "ab" * 5000}.get(kind, "".join(rng.choices("abcdefxyz", k=rng.randint(1, 8))))
    big = 10**12 if t is int else 1e12
    if kind == "empty":
        return t(0)
    if kind == "large":
        return t(rng.choice((big, -big)))
    return t(rng.randint(-50, 50)) if t is int else round(rng.uniform(-50, 50), 3)


def draw_cases(types: list, *, n: int, seed: str) -> list[tuple]:
    """``n`` distinct argument tuples of the kinds in KINDS (special characters only where a string
    argument takes them, else a normal case)."""
    rng, out = random.Random(seed), []
    has_str = any(t is str or t == [str] for t in types)
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        if kind == "special" and not has_str:
            kind = "normal"
        for attempt in range(40):  # a kind with one value (an int's empty 0) falls back to normal cases
            case = tuple(_value(t, kind if attempt < 20 else "normal", rng) for t in types)
            if case not in out:
                out.append(case)
                break
    return out


class CaseGenerator:
    """Generated tests per problem, computed once per (reference, tests) and cached; thread-safe."""

    def __init__(self, grader: CodeGrader, *, n: int = 10, timeout: float = 5.0):
        self.grader, self.n, self.timeout = grader, n, timeout
        self._cache: dict[str, list[str]] = {}
        self._lock = threading.Lock()

    def tests_for(self, sample: dict) -> list[str]:
        """The generated tests of a sample with a reference (``reference``, else ``answer``) and assert tests."""
        tests, ref = sample.get("tests") or [], sample.get("reference", sample.get("answer"))
        if not tests or not isinstance(ref, str):
            return []
        key = hashlib.sha256(repr((ref, tests, self.n)).encode()).hexdigest()
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        made = self._generate(extract_code(ref), tests, key)
        with self._lock:
            self._cache[key] = made
        return made

    def _generate(self, reference: str, tests: list[str], key: str) -> list[str]:
        sig = signature(tests)
        if sig is None:
            return []
        name, types = sig
        calls = [f"{name}({', '.join(repr(a) for a in case)})" for case in draw_cases(types, n=self.n, seed=key)]
        # one run per case (a case the reference fails on must not drop the others), all at once: the
        # sandbox's slots bound how many run together
        with cf.ThreadPoolExecutor(max(1, len(calls))) as ex:
            values = list(ex.map(lambda c: self._reference_value(reference, c), calls))
        return [f"assert {c} == {v}" for c, v in zip(calls, values) if v is not None]

    def _reference_value(self, reference: str, call: str) -> str | None:
        """repr of the reference's value at ``call``, run in the sandbox; None when it did not give one."""
        nonce = secrets.token_hex(16)
        res = self.grader.sandbox.run({"solution.py": reference, "test.json": f'["{_escape(call)}"]'}, ["assert"],
                                      timeout=self.timeout, stdin_data=nonce + "\n")
        lines = [ln for ln in res.stdout.splitlines() if ln.startswith(nonce + " ")]
        if res.timed_out or res.truncated or len(lines) != 1 or lines[0][len(nonce) + 1:].startswith("!"):
            return None
        try:
            with AST_LOCK:
                (value,) = ast.literal_eval(lines[0][len(nonce) + 1:])
            text = repr(value)
            ok = ast.literal_eval(text) == value and len(text) <= 100_000
        except Exception:
            return None
        return text if ok else None


def _escape(call: str) -> str:
    import json

    return json.dumps(call)[1:-1]


GENERATORS = ProcessCache("the test generator of each grader (its references' outputs, computed once)",
                          stale_when="its grader is no longer the default one: the key is the grader itself")


def default_generator() -> CaseGenerator:
    """The process-wide generator behind ``code_generated``, on the code rewards' grader."""
    grader = default_grader()
    return GENERATORS.get_or_make(grader, lambda: CaseGenerator(grader))


def with_generated_tests(samples: list[dict], generator: CaseGenerator) -> list[dict]:
    """The samples with their generated tests appended to their own (each problem generated once, the
    step's problems concurrently)."""
    unique = {id(s): s for s in samples}
    with cf.ThreadPoolExecutor(max(1, min(len(unique), 8))) as ex:  # these threads only wait
        made = dict(zip(unique, ex.map(generator.tests_for, unique.values())))
    return [dict(s, tests=list(s["tests"]) + made[id(s)]) if made[id(s)] else s for s in samples]


def code_generated_batch_reward(completions: list[str], samples: list[dict]) -> list:
    """The ``code`` reward over the sample's tests plus ten generated from its reference solution."""
    return code_batch_reward(completions, with_generated_tests(samples, default_generator()))
