"""The logic-breakpoint detector: equations, inference connectives and the step after each, in
English and Chinese. Pure text functions (no models), shared by the reasoning-chain audit, the
logic-consistency regulariser and the data filter.

The practice this follows ("GRPO: not an upgrade of PPO but a scalpel for LLM reasoning", Towards
AI, 2025, section 4.2) extracts every equation and every connective ("therefore", "hence",
"由…得", "因此", "故") of an answer and checks the step after each: there most errors of a model on
an accuracy plateau sat, in the first sentence after "因此".

A *connective* here is a word or phrase that announces a derived statement; its *following step* is
the text from the end of the connective to the end of its sentence (a full stop, ?, !, their
full-width forms, a semicolon, or a line break). "由 A 得 B" is one connective whose following step
is B. An *equation* is "lhs = rhs" (also ＝); it is *arithmetic* when both sides are numeric
expressions, and then ``arithmetic_value`` checks it.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass

# English connectives, longest first so "it follows that" wins over "so" at the same place
CONNECTIVES_EN = ("it follows that", "which gives", "this gives", "we get", "we obtain", "by substitution",
                  "consequently", "therefore", "hence", "thus", "so")
# Chinese connectives; "由…得" is matched separately (it spans its premise)
CONNECTIVES_ZH = ("综上所述", "综上", "因此", "所以", "于是", "从而", "可得", "故")
_EN = re.compile(r"\b(" + "|".join(re.escape(c) for c in CONNECTIVES_EN) + r")\b[,:]?", re.IGNORECASE)
# 故 inside a word (事故, 故事, 缘故) is not an inference
_ZH = re.compile(r"(" + "|".join(re.escape(c) for c in CONNECTIVES_ZH if c != "故") + r"|(?<![事缘])故(?!事|障|意))[，,:：]?")
_ZH_YOU_DE = re.compile(r"由([^。！？!?\n；;]{1,40}?)(?:可得|可知|得到|得出|得)[，,:：]?")
_SENTENCE_END = re.compile(r"[.!?。！？；;\n]")


@dataclass(frozen=True)
class Connective:
    """One connective in a text: the words as written, where they are, and the following step."""

    word: str  # as written ("Therefore", "因此", "由…得")
    start: int
    end: int
    following: str  # the rest of its sentence, stripped ('' when the sentence ends right there)


@dataclass(frozen=True)
class Equation:
    """One "lhs = rhs" of a text. ``value_ok`` is None unless both sides are arithmetic, else whether
    they evaluate equal (to ``tol``, relative)."""

    lhs: str
    rhs: str
    at: int  # where its "=" is
    value_ok: bool | None


@dataclass(frozen=True)
class Breakpoint:
    """A connective whose following step does not hold: ``reason`` is "empty" (nothing follows it)
    or "false" (an equation in it evaluates false)."""

    connective: Connective
    reason: str


def _sentence_end(text: str, at: int) -> int:
    m = _SENTENCE_END.search(text, at)
    # a full stop inside a number (3.5) does not end a sentence
    while m and m.group() == "." and m.start() + 1 < len(text) and text[m.start() + 1].isdigit():
        m = _SENTENCE_END.search(text, m.start() + 1)
    return m.start() if m else len(text)


def find_connectives(text: str) -> list[Connective]:
    """Every connective of ``text`` (English and Chinese), in order, each with its following step."""
    found: list[tuple[int, int, str]] = []
    for m in _ZH_YOU_DE.finditer(text):
        found.append((m.start(), m.end(), "由…得"))
    taken = [(s, e) for s, e, _ in found]
    for pattern in (_EN, _ZH):
        for m in pattern.finditer(text):
            if not any(s <= m.start() < e for s, e in taken):
                found.append((m.start(), m.end(), m.group(1)))
                taken.append((m.start(), m.end()))
    out = []
    for start, end, word in sorted(found):
        following = text[end:_sentence_end(text, end)].strip()
        rest = text[end:]
        if not following and rest.lstrip(" \t:：,，").startswith("\n"):  # "Therefore:" then the step's line
            nxt = rest.lstrip(" \t:：,，\n")
            following = nxt[:_sentence_end(nxt, 0)].strip()
        out.append(Connective(word, start, end, following))
    return out


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Pow: operator.pow}


def _eval_node(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval_node(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponent too large")
        return _OPS[type(node.op)](left, right)
    raise ValueError("not arithmetic")


def arithmetic_value(expr: str) -> float | None:
    """The value of a numeric expression (numbers with optional thousands commas, + - * / × ÷ ^ **,
    'x' between numbers as times, parentheses, a leading $ or trailing %), or None when ``expr`` is
    not one (a variable, words, a division by zero)."""
    s = expr.strip().rstrip(".").replace("$", "").replace("×", "*").replace("÷", "/").replace("·", "*")
    s = s.replace("^", "**").replace("（", "(").replace("）", ")")
    s = re.sub(r"(?<=\d),(?=\d{3}\b)", "", s)
    s = re.sub(r"(?<=[\d)\s])[xX](?=[\s\d(])", "*", s)
    if not s or not re.fullmatch(r"[\d\s.+\-*/()]+", s) or not re.search(r"\d", s):
        return None
    try:
        return _eval_node(ast.parse(s, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, RecursionError):
        return None


def _close(a: float, b: float, tol: float) -> bool:
    return abs(a - b) <= tol * max(1.0, abs(a), abs(b))


_OPERAND = r"[(（]*\s*(?:\$?\d+(?:[.,]\d+)*%?(?:[A-Za-z_]\w*)?|[A-Za-z_]\w*|[\u4e00-\u9fff]{1,4})\s*[)）]*"
_OPERATOR = r"(?:\*\*|[-+*/×÷^·]|(?<=\s)[xX](?=\s))"
_EXPR = rf"-?\s*{_OPERAND}(?:\s*{_OPERATOR}\s*-?\s*{_OPERAND})*"
_GSM8K_CALC = re.compile(r"<<[^<>\n]*>>")
_LHS = re.compile(rf"({_EXPR})\s*$")
_RHS = re.compile(rf"^\s*({_EXPR})")


def find_equations(text: str, *, tol: float = 1e-6) -> list[Equation]:
    """Every "lhs = rhs" of ``text``: each side is the longest expression (numbers, names, operators
    and parentheses; a Chinese name of up to 4 characters) touching the "=", so words before or after
    stay out. A chain "a = b = c" gives (a, b) and (b, c). ``value_ok``: see ``Equation``."""
    out: list[Equation] = []
    text = _GSM8K_CALC.sub(lambda m: " " * len(m.group()), text)  # GSM8K's <<48/2=24>> calculator notes
    for m in re.finditer(r"[=＝]", text):
        before, after = text[:m.start()], text[m.end():]
        left, right = _LHS.search(before.split("\n")[-1]), _RHS.search(after.split("\n")[0])
        if not left or not right or not left.group(1).strip() or not right.group(1).strip():
            continue
        lhs, rhs = left.group(1).strip(), right.group(1).strip()
        a, b = arithmetic_value(lhs), arithmetic_value(rhs)
        ok = None if a is None or b is None else _close(a, b, tol)
        out.append(Equation(lhs, rhs, m.start(), ok))
    return out


def logical_steps(text: str) -> int:
    """Derivations in ``text``: sentences (or lines) that hold a connective or an equation. The data
    filter keeps problems whose solution has at least three."""
    pieces = re.split(r"(?<=[.!?。！？；;\n])(?!\d)", text)
    return sum(1 for p in pieces if p.strip() and (find_connectives(p) or find_equations(p)))


def breakpoints(text: str) -> list[Breakpoint]:
    """The connectives whose following step fails: nothing follows ("empty") or an arithmetic
    equation in it evaluates false ("false")."""
    out = []
    for c in find_connectives(text):
        if not c.following:
            out.append(Breakpoint(c, "empty"))
        elif any(e.value_ok is False for e in find_equations(c.following)):
            out.append(Breakpoint(c, "false"))
    return out
