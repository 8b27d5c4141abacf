"""A style reward for code (seed 003 section 5.1: extra credit for type hints, a docstring and exception
handling), kept apart from correctness: weigh it against the tests with ``reward_weights``, e.g.
``rewards=code,code_style reward_weights=1,0.1``. Nothing runs: the program is only parsed.

Each check is a share in [0, 1] over the program's functions (lambdas are not functions here):
- hints: functions whose every parameter (except self/cls) and return value is annotated;
- docstring: functions with a docstring;
- exceptions: 1.0 when the program handles or raises an exception (try/except or raise) at all.
The score is their weighted mean (``STYLE_WEIGHTS``); a program with no function scores its
exception check only, an unparsable one 0.0.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from grpo.rewards.code import AST_LOCK, extract_code

STYLE_WEIGHTS = {"hints": 0.4, "docstring": 0.3, "exceptions": 0.3}


@dataclass
class StyleChecks:
    hints: float
    docstring: float
    exceptions: float
    parsed: bool


def _annotated(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    a = fn.args
    params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *([a.vararg] if a.vararg else []),
              *([a.kwarg] if a.kwarg else [])]
    if params and params[0].arg in ("self", "cls"):
        params = params[1:]
    return fn.returns is not None and all(p.annotation is not None for p in params)


def style_checks(code: str) -> StyleChecks:
    """The three style checks of a program's source."""
    try:
        with AST_LOCK:
            tree = ast.parse(code)
            fns = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
            handles = any(isinstance(n, (ast.Try, ast.Raise)) or type(n).__name__ == "TryStar"
                          for n in ast.walk(tree))
            docs = [ast.get_docstring(f) is not None for f in fns]
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return StyleChecks(0.0, 0.0, 0.0, parsed=False)
    n = len(fns)
    return StyleChecks(hints=sum(_annotated(f) for f in fns) / n if n else 0.0,
                       docstring=sum(docs) / n if n else 0.0, exceptions=float(handles), parsed=True)


def style_score(code: str, *, weights: dict[str, float] = STYLE_WEIGHTS) -> float:
    """Weighted mean of the style checks of ``code`` (weights: hints, docstring, exceptions)."""
    if set(weights) != set(STYLE_WEIGHTS) or any(w < 0 for w in weights.values()) or not sum(weights.values()):
        raise ValueError(f"code_style: weights need the keys {sorted(STYLE_WEIGHTS)}, >= 0, not all 0; got {weights}")
    c = style_checks(code)
    return sum(w * getattr(c, k) for k, w in weights.items()) / sum(weights.values())


def code_style_reward(completion: str, sample: dict) -> float:
    """The style score of the completion's program (its last fenced code block, else the whole text)."""
    return style_score(extract_code(completion))
