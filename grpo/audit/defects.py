"""The reasoning-chain audit's four defect detectors on one numbered-step answer, in English and
Chinese. Pure text functions: a completion (and its problem) in, findings out.

The audit follows the "reasoning chain audit" of "GRPO: not an upgrade of PPO but a scalpel for LLM
reasoning" (Towards AI, 2025, section 5.2): ask for numbered steps and count, per 100 tokens, the
defects of four kinds. What counts as one defect of each kind here (each is decidable from the text):

- completeness: no numbered steps at all; a missing step number (1, 2, 4); an empty step; a
  connective followed by nothing; no final answer; a number used in a calculation that neither the
  problem nor any step derives (a step left out).
- order: a step number not above the one before (3 after 4, a repeated number); a number used in a
  calculation before the later step that derives it.
- symbols: a variable given two different values (x = 5, later x = 7); a variable used in an
  equation that was never defined ("let x", "设 x", "x = ...", or the problem's own), e.g. renamed
  from one step to the next.
- calculation: an arithmetic equation whose sides evaluate different (each one is evaluated).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from grpo.data.logic import arithmetic_value, find_connectives, find_equations

KINDS = ("completeness", "order", "symbols", "calculation")
_ZH_DIGITS = {c: i for i, c in enumerate("零一二三四五六七八九十", start=0)}
_STEP = re.compile(r"^\s*(?:\*\*)?(?:step\s*(\d+)|第\s*([\d一二三四五六七八九十]+)\s*步|步骤\s*(\d+)|(\d+)\s*[.)、](?!\d))"
                   r"\s*(?:\*\*)?[:：.]?\s*(?:\*\*)?", re.IGNORECASE)
_FINAL = re.compile(r"^\s*(?:final answer|answer|the answer is|####|答案|答)\s*[:：是为]?\s*(.*)$", re.IGNORECASE)
_NUMBER = re.compile(r"(?<![A-Za-z\d_.])\d+(?:,\d{3})*(?:\.\d+)?")
# numbers a step may use without deriving them: counts, unit conversions, percentages
COMMON_CONSTANTS = frozenset({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 24, 30, 52, 60, 100, 365, 1000})
_SYMBOL = re.compile(r"^[A-Za-z](?:_?\d)?$")
_DEFINE = re.compile(r"(?:\blet\s+|设|令|\bdenote\s+)([A-Za-z](?:_?\d)?)\b|\b([A-Za-z](?:_?\d)?)\s+(?:be|denote|represents?|is the)\b",
                     re.IGNORECASE)


@dataclass(frozen=True)
class Step:
    """One numbered step: its number as written (None for text before the first number) and text."""

    number: int | None
    text: str


@dataclass(frozen=True)
class Finding:
    """One defect: its kind (``KINDS``), the step it was found in (None: the answer as a whole), why."""

    kind: str
    step: int | None
    detail: str


@dataclass
class SampleAudit:
    """The audit of one completion: its steps, whether it has a final answer, the arithmetic
    equations checked and every finding."""

    steps: list[Step]
    final_answer: str | None
    equations_checked: int
    findings: list[Finding] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {k: sum(f.kind == k for f in self.findings) for k in KINDS}


def _step_number(m: re.Match) -> int:
    raw = next(g for g in m.groups() if g)
    if raw.isdigit():
        return int(raw)
    if raw == "十":
        return 10
    if raw.startswith("十"):
        return 10 + _ZH_DIGITS[raw[1]]
    if "十" in raw:  # 二十, 二十一
        tens, _, ones = raw.partition("十")
        return _ZH_DIGITS[tens] * 10 + (_ZH_DIGITS[ones] if ones else 0)
    return _ZH_DIGITS[raw]


def parse_steps(text: str) -> tuple[list[Step], str | None]:
    """The numbered steps of ``text`` ("Step 1:", "1.", "1)", "第一步", "第1步", "步骤1"; a line that
    starts none continues the step before) and the final answer line's text ("Answer: 17",
    "#### 17", "答案：17"), or None."""
    steps: list[Step] = []
    final = None
    for line in text.splitlines():
        if not line.strip():
            continue
        fm = _FINAL.match(line)
        if fm and not _STEP.match(line):
            final = fm.group(1).strip()
            continue
        m = _STEP.match(line)
        if m:
            steps.append(Step(_step_number(m), line[m.end():].strip()))
        elif steps:
            steps[-1] = Step(steps[-1].number, (steps[-1].text + " " + line.strip()).strip())
        else:
            steps.append(Step(None, line.strip()))
    return steps, final


def _numbers(text: str) -> set[float]:
    return {float(n.replace(",", "")) for n in _NUMBER.findall(text)}


def _operands(lhs: str) -> set[float]:
    return _numbers(lhs) if arithmetic_value(lhs) is not None else set()


def _numbering(steps: list[Step]) -> list[Finding]:
    """Completeness (a missing number, an empty step) and order (a number not above the last)."""
    out, numbers = [], [s.number for s in steps if s.number is not None]
    for s in steps:
        if s.number is not None and not s.text:
            out.append(Finding("completeness", s.number, f"step {s.number} is empty"))
    for prev, cur in zip(numbers, numbers[1:]):
        if cur <= prev:
            out.append(Finding("order", cur, f"step {cur} comes after step {prev}"))
    present = set(numbers)
    out += [Finding("completeness", k, f"step {k} is missing") for k in range(1, max(numbers, default=0) + 1)
            if k not in present]
    return out


def _derivations(steps: list[Step], problem: str) -> list[Finding]:
    """A calculation's operand that nothing before derives: a later step derives it (order) or none
    does (completeness, a step left out)."""
    out, known = [], _numbers(problem) | set(COMMON_CONSTANTS)
    derived_at = [{float(v) for e in find_equations(s.text) if (v := arithmetic_value(e.rhs)) is not None}
                  for s in steps]
    for i, s in enumerate(steps):
        for e in find_equations(s.text):
            for v in sorted(_operands(e.lhs) - known):
                later = [steps[j].number for j in range(i + 1, len(steps)) if v in derived_at[j]]
                shown = f"{v:g}"
                if later:
                    out.append(Finding("order", s.number, f"uses {shown} before step {later[0]} derives it"))
                else:
                    out.append(Finding("completeness", s.number, f"uses {shown}, which no step derives"))
                known.add(v)
            rhs = arithmetic_value(e.rhs)
            if rhs is not None:
                known.add(rhs)
        known |= _numbers(s.text)
    return out


def _symbols(steps: list[Step], problem: str) -> list[Finding]:
    """A variable with two values, or one used in an equation before any definition."""
    out: list[Finding] = []
    defined = {m.group(1) or m.group(2) for m in _DEFINE.finditer(problem)} | {
        e.lhs for e in find_equations(problem) if _SYMBOL.match(e.lhs)}
    values: dict[str, tuple[float, int | None]] = {}
    for s in steps:
        defined |= {m.group(1) or m.group(2) for m in _DEFINE.finditer(s.text)}
        for e in find_equations(s.text):
            if _SYMBOL.match(e.lhs):
                v = arithmetic_value(e.rhs)
                if v is not None and e.lhs in values and values[e.lhs][0] != v:
                    was, at = values[e.lhs]
                    out.append(Finding("symbols", s.number, f"{e.lhs} = {v:g} here but {was:g} in step {at}"))
                if v is not None:
                    values.setdefault(e.lhs, (v, s.number))
                defined.add(e.lhs)
            used = set(re.findall(r"(?<![A-Za-z_])([A-Za-z](?:_?\d)?)(?![A-Za-z_\d])", e.rhs + " " + e.lhs))
            used -= {"x", "X"} if re.search(r"\d\s*[xX]\s*\d", e.lhs + e.rhs) else set()
            for name in sorted(used - defined):
                out.append(Finding("symbols", s.number, f"{name} is used but never defined"))
                defined.add(name)
    return out


def _calculations(steps: list[Step]) -> tuple[list[Finding], int]:
    out, checked = [], 0
    for s in steps:
        for e in find_equations(s.text):
            if e.value_ok is None:
                continue
            checked += 1
            if not e.value_ok:
                out.append(Finding("calculation", s.number,
                                   f"{e.lhs} = {e.rhs} is false ({e.lhs} = {arithmetic_value(e.lhs):g})"))
    return out, checked


def audit_completion(completion: str, problem: str = "") -> SampleAudit:
    """Every finding of the four detectors on ``completion`` (an answer to ``problem``)."""
    steps, final = parse_steps(completion)
    numbered = [s for s in steps if s.number is not None]
    calc, checked = _calculations(steps)
    result = SampleAudit(steps=steps, final_answer=final, equations_checked=checked)
    f = result.findings
    if not numbered:
        f.append(Finding("completeness", None, "no numbered steps"))
    f += _numbering(steps)
    f += [Finding("completeness", None, f"nothing follows {c.word!r}") for c in find_connectives(completion)
          if not c.following]
    if final is None:
        f.append(Finding("completeness", None, "no final answer"))
    f += _derivations(steps, problem)
    f += _symbols(steps, problem)
    f += calc
    return result
