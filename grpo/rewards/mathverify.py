"""Verified math answers: math-verify equivalence under a hard wall-clock deadline, with hedges scoring 0.

math-verify parses LaTeX into sympy and compares by simplification, which can run for minutes on an
adversarial expression; its own timeout uses SIGALRM, which only works on the main thread (elsewhere
it raises, and a caller that catches everything records a silent 0). So every parse and every
comparison runs in a small pool of spawned worker processes: the caller (any thread) sends two strings
down a pipe and waits at most ``timeout`` seconds for one float. A worker that passes its deadline is
killed and replaced; ``math_reward`` then raises TimeoutError for that sample (the trainer counts it as a
failed reward: None would mean "not applicable to this row") and
``MathVerifier.timeouts`` goes up. Sympy objects never leave the worker, so nothing is stringified
or simplified outside the deadline.

Answers (the rules the issue sets, tested in tests/test_rewards_math.py):
- gold: the number after ``####`` when present (GSM8K), else the whole answer (LaTeX or plain);
- completion: every \\boxed{} when there is one, else the last number in the text;
- thousands separators: ``1,234`` is 1234; ``7,2`` is not 72 (it is two numbers, a hedge); ``72.00`` is 72;
- hedges score 0: an empty box, several boxes that are not all equivalent to the gold, ``42 or 43``,
  a list, set or interval of numbers when the gold is a single number.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import json
import os
import re
import select
import subprocess
import sys
import threading
from pathlib import Path

from grpo.infra.process_cache import ProcessCache
from grpo.infra.processes import die_with_parent
from grpo.rewards.answers import NUMBER, THOUSANDS, all_boxed, numbers_in, parse_number

PLAIN_NUMBER = re.compile(r"\$?-?\d+(?:\.\d+)?\s*(?:\\?%)?\$?")
HEDGE_WORDS = re.compile(r"(?:\bor\b|\\lor|\\text\{\s*or\s*\}|\\pm|±|\band/or\b|\bmaybe\b|\beither\b)", re.IGNORECASE)
LIST_MARKS = re.compile(r"[,;|&]|\\(?:vee|wedge|mid|lor|land)\b|\\{|\\}|\\cup\b|\\cap\b|\\in\b|\\(?:le|ge|leq|geq|lt|gt|neq)\b|[<>≤≥]|\\infty\b|"
                        r"\\[lc]?dots\b|\.\.\.")


def gold_answer(answer: str) -> str:
    """The gold answer text: after the last '####' when present (GSM8K), thousands separators removed."""
    gold = str(answer).split("####")[-1].strip() if "####" in str(answer) else str(answer).strip()
    return THOUSANDS.sub(lambda m: m.group(0).replace(",", ""), gold) if THOUSANDS.fullmatch(gold) else gold


def normalize_number_text(s: str) -> str:
    """Strip $, \\$, %, \\%, \\!, \\, and spaces; '1,234' -> '1234' (only well-formed groups of three)."""
    t = re.sub(r"\\[!,;: ]|\\text\{\s*\}|\\?\$|\\?%", "", s).strip().rstrip(".")
    return t.replace(",", "") if THOUSANDS.fullmatch(t) else t


def _scalar(gold: str) -> float | None:
    """The gold as one number, or None when it is an expression, set, interval, ..."""
    return parse_number(normalize_number_text(gold)) if PLAIN_NUMBER.fullmatch(gold.strip()) else None


MATH_SPAN = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)


def _last_math_span(text: str) -> str | None:
    """Content of the last $...$, \\(...\\) or \\[...\\] span when the text's last number lies inside it."""
    spans = list(MATH_SPAN.finditer(text))
    nums = list(re.finditer(r"\d", text))
    if not spans or not nums or not spans[-1].start() <= nums[-1].start() < spans[-1].end():
        return None
    return next(g for g in spans[-1].groups() if g is not None).strip()


SENTENCE_END = re.compile(r"(?<!\d)[.!?](?!\d)|\n")
# what joins the last two numbers of a list or a range: 'a, b', 'a; b', 'between a and b'
LIST_JOIN = re.compile(r"\s*(?:,|;|and)\s*(?:\$|\\\$)?\s*", re.IGNORECASE)


def _hedged_sentence(text: str) -> bool:
    """Whether the final answer (the text's last number) is offered beside another: joined to the
    number before it in its sentence as a list or range ('41, 42, 43', 'between 40 and 50', '7,2'),
    or by a hedge word ('42 or 43', '42, or maybe 43'). Only the last two numbers are looked at, so
    'the sum of 3 and 4 is 7' or '10 - 3 = 7' are not hedges."""
    last = list(NUMBER.finditer(text))[-1]
    starts = [m.end() for m in SENTENCE_END.finditer(text, 0, last.start())]
    start = starts[-1] if starts else 0
    nums = list(NUMBER.finditer(text, start, last.end()))
    if len(nums) < 2:
        return False
    between = text[nums[-2].end():last.start()]
    return bool(LIST_JOIN.fullmatch(between) or (len(between) <= 24 and HEDGE_WORDS.search(between)))


def candidates(completion: str, gold: str) -> list[str] | None:
    """The completion's answer(s) to check, every one of which must match; None when it hedges or has none."""
    boxes = all_boxed(completion)
    if boxes:
        answers = [normalize_number_text(b) for b in boxes]
        if any(not a for a in answers):
            return None  # an empty box
    else:
        nums = numbers_in(completion)
        if not nums:
            return None
        if _scalar(gold) is not None and _hedged_sentence(completion):
            return None  # 'the answer is 42 or 43. Done.', '41, 42, 43', 'between 40 and 50', '7,2'
        answers = [normalize_number_text(_last_math_span(completion) or nums[-1])]
    scalar_gold = _scalar(gold) is not None
    for a in answers:
        if HEDGE_WORDS.search(a):
            return None
        if scalar_gold and LIST_MARKS.search(a):
            return None  # a list, set or interval offered where one number is asked for
    return answers


def _plain_equal(gold: str, answers: list[str]) -> bool | None:
    """Exact numeric comparison when the gold and every answer are plain numbers; None otherwise."""
    g = _scalar(gold)
    vals = [parse_number(a) if PLAIN_NUMBER.fullmatch(a) else None for a in answers]
    if g is None or any(v is None for v in vals):
        return None
    return all(v == g for v in vals)


# ---- the worker side --------------------------------------------------------------------------------
def _verify_in_worker(gold: str, answers: list[str]) -> float:
    from math_verify import parse, verify

    g = parse(f"${gold}$", parsing_timeout=None) or parse(gold, parsing_timeout=None)
    if not g:
        return 0.0
    scalar = _scalar(gold) is not None
    for a in answers:
        p = parse(f"$\\boxed{{{a}}}$", parsing_timeout=None) or parse(a, parsing_timeout=None)
        if not p or (scalar and not _single_value(p[0])) or not verify(g, p, timeout_seconds=None):
            return 0.0
    return 1.0


def _single_value(obj) -> bool:
    """One number (or 'x = number'), not a set, interval, disjunction or relation: math-verify counts
    a gold as matched by any member of a set, so '42 \\vee 43' or '\\{42, 43\\}' would match 43."""
    import sympy

    if isinstance(obj, sympy.Eq) and getattr(obj.lhs, "is_Symbol", False):
        obj = obj.rhs
    return isinstance(obj, sympy.Basic) and bool(obj.is_number)


def _serve(parent_pid: int) -> None:
    """Worker loop: one JSON request per stdin line -> one JSON reply per line on the original stdout.
    The worker dies with the thread that started it: a parent killed mid-call must not leave a worker
    computing for ever (a C-level bigint power holds the GIL, so no watchdog thread could stop it)."""
    die_with_parent(parent_pid)
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything the libraries print goes to stderr, never into the protocol
    import logging

    import math_verify  # noqa: F401  (imported before the first deadline starts)

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled": ours is outside

    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        gold, answers = json.loads(line)
        try:
            reply = {"value": _verify_in_worker(gold, answers)}
        except Exception as e:  # a parse error is this sample's failure, reported as such
            reply = {"error": f"math-verify failed: {type(e).__name__}: {e}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


def _readline(proc: subprocess.Popen, timeout: float) -> str | None:
    """One line from the worker within ``timeout`` seconds, else None."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline() if ready else None


class _Worker:
    def __init__(self, start_timeout: float):
        root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen([sys.executable, "-c", f"from grpo.rewards.mathverify import _serve; _serve({os.getpid()})"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                     start_new_session=True)
        if (_readline(self.proc, start_timeout) or "").strip() != "ready":
            self.kill()
            raise RuntimeError(f"math-verify worker did not start within {start_timeout:g} s")

    def ask(self, gold: str, answers: list[str], timeout: float) -> str | None:
        self.proc.stdin.write(json.dumps([gold, answers]) + "\n")
        self.proc.stdin.flush()
        return _readline(self.proc, timeout)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(5)
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


class MathVerifier:
    """A thread-safe pool of math-verify worker processes with a hard deadline per call.

    ``verifier(gold, answers)`` -> 1.0 / 0.0, or None when the worker passed ``timeout`` seconds (it is
    killed and replaced; ``timeouts`` counts these) or died. Workers start on first use.
    """

    def __init__(self, *, timeout: float = 5.0, workers: int = 2, start_timeout: float = 60.0):
        self.timeout, self.size, self.start_timeout = timeout, workers, start_timeout
        self.timeouts = 0
        self._idle: list[_Worker] = []
        self._started = 0
        self._cond = threading.Condition()
        self._pid = os.getpid()
        self._spawner = cf.ThreadPoolExecutor(1, thread_name_prefix="math-verify-spawner")
        atexit.register(self.close)

    def _checkout(self) -> _Worker:
        with self._cond:
            while not self._idle and self._started >= self.size:
                self._cond.wait()
            if self._idle:
                return self._idle.pop()
            self._started += 1
        try:  # started from one long-lived thread: the workers' parent-death signal follows that thread
            return self._spawner.submit(_Worker, self.start_timeout).result()
        except BaseException:
            with self._cond:
                self._started -= 1
                self._cond.notify()
            raise

    def _checkin(self, worker: _Worker | None) -> None:
        with self._cond:
            if worker is None:
                self._started -= 1
            else:
                self._idle.append(worker)
            self._cond.notify()

    def __call__(self, gold: str, answers: list[str]) -> float | None:
        worker = self._checkout()
        try:
            line = worker.ask(gold, answers, self.timeout)
            if line:  # a reply within the deadline
                reply = json.loads(line)
                self._checkin(worker)
                if "error" in reply:
                    raise RuntimeError(reply["error"])
                return float(reply["value"])
            if line is None:
                with self._cond:
                    self.timeouts += 1
        except (OSError, ValueError):
            pass  # the worker died or garbled its reply: this call has no verdict
        worker.kill()
        self._checkin(None)
        return None

    def close(self) -> None:
        if os.getpid() != self._pid:
            return
        with self._cond:
            idle, self._idle = self._idle, []
            self._started -= len(idle)
        for w in idle:
            w.kill()


VERIFIERS = ProcessCache("the verifier behind math_reward, with its worker pool (key 'default')",
                         stale_when="never within a process: the pool replaces a worker it kills")


def default_verifier() -> MathVerifier:
    """The process-wide verifier behind ``math_reward`` (created on first use)."""
    return VERIFIERS.get_or_make("default", MathVerifier)


def math_reward(completion: str, sample: dict) -> float | None:
    """1.0 when the completion's final answer is equivalent to sample['answer'] (math-verify, under a
    hard deadline); 0.0 when it differs, hedges or has no answer; TimeoutError when the verifier gave
    no verdict within its deadline (a failure of that sample, not "not applicable")."""
    gold = gold_answer(sample["answer"])
    if not gold:
        raise ValueError("math_reward: sample['answer'] is empty")
    answers = candidates(completion, gold)
    if answers is None:
        return 0.0
    plain = _plain_equal(gold, answers)
    if plain is not None:
        return float(plain)
    value = default_verifier()(gold, answers)
    if value is None:
        raise TimeoutError(f"math-verify gave no verdict within its {default_verifier().timeout:g} s deadline")
    return value
