"""Step-completeness shaping (seed 003 section 3.3): the share of structural checks a completion fails.

The seed shapes a reward model's score as ``r_final = r_raw - lambda * (1 - completeness)`` with
lambda = 0.3, completeness from a light rule engine: step markers (第一步, 第二步), conclusion markers
(因此, 综上) and formulas whose delimiters come in pairs (brackets, summation/formula delimiters).
Here the reward is the *incompleteness* ``1 - completeness`` in [0, 1], so the seed's shaping is
``rewards=reward_model,incompleteness_zh reward_weights=1,-0.3``.

Two languages (the language setting is the reward's name):
- ``incompleteness`` (en): numbered steps ('Step 1', '1.' or '1)' lines) when there are several lines,
  balanced ( [ {, paired $, no line ending in a dangling '=' or operator (4 checks).
- ``incompleteness_zh``: the seed's markers: both 第一步 and 第二步 (in that order) when the answer
  has several lines or sentences, a conclusion marker (因此 or 综上), balanced brackets including
  the full-width （ ） 【 】 ｛ ｝, paired formula delimiters ($ and $$, \\( \\), \\[ \\],
  \\begin{x} ... \\end{x}), and no dangling operator (5 checks).
"""

from __future__ import annotations

import re

OPEN, CLOSE = "([{（【｛", ")]}）】｝"
ASCII_OPEN, ASCII_CLOSE = "([{", ")]}"
LANGUAGES = ("en", "zh")


def balanced(text: str, opens: str = ASCII_OPEN, closes: str = ASCII_CLOSE) -> bool:
    """Whether every bracket of ``opens`` is closed by its partner in ``closes``, properly nested."""
    depth = []
    for ch in text:
        if ch in opens:
            depth.append(ch)
        elif ch in closes:
            if not depth or opens[closes.index(ch)] != depth.pop():
                return False
    return not depth


def _dangling(lines: list[str]) -> bool:
    return any(re.search(r"[=+\-*/×÷＝]\s*$", ln) for ln in lines)


def _dollars_paired(text: str) -> bool:
    return text.replace("\\$", "").count("$") % 2 == 0


def formula_delimiters_paired(text: str) -> bool:
    """$ / $$ paired, \\( with \\), \\[ with \\], and every \\begin{x} closed by \\end{x} in order."""
    if not _dollars_paired(text):
        return False
    stack = []
    for m in re.finditer(r"\\([()\[\]])|\\(begin|end)\{([^}]*)\}", text):
        bracket, kind, env = m.groups()
        if bracket in ("(", "[") or kind == "begin":
            stack.append(bracket or "env:" + env)
        else:
            want = {")": "(", "]": "["}.get(bracket) if bracket else "env:" + env
            if not stack or stack.pop() != want:
                return False
    return not stack


def _checks_en(text: str, lines: list[str]) -> list[bool]:
    numbered = len(lines) < 2 or any(re.match(r"(?:step\s*)?\d+\s*[.):]", ln, re.IGNORECASE) for ln in lines)
    return [numbered, balanced(text), _dollars_paired(text), not _dangling(lines)]


def _checks_zh(text: str, lines: list[str]) -> list[bool]:
    several = len(lines) >= 2 or len([s for s in re.split(r"[。！？!?]", text) if s.strip()]) >= 2
    first, second = text.find("第一步"), text.find("第二步")
    stepped = not several or (0 <= first < second)
    concluded = "因此" in text or "综上" in text
    return [stepped, concluded, balanced(text, OPEN, CLOSE), formula_delimiters_paired(text), not _dangling(lines)]


def incompleteness(text: str, *, language: str = "en") -> float:
    """Share of the language's completeness checks ``text`` fails: 0.0 complete, 1.0 all failed."""
    if language not in LANGUAGES:
        raise ValueError(f"incompleteness: unknown language {language!r}; valid: {list(LANGUAGES)}")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    checks = _checks_en(text, lines) if language == "en" else _checks_zh(text, lines)
    return sum(not c for c in checks) / len(checks)
