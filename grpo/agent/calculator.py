"""The built-in ``calculator`` tool: arithmetic evaluated by walking Python's syntax tree.

Never ``eval``: the expression is parsed with ``ast.parse(mode="eval")`` and only numbers, + - * / **
(and unary + -) and parentheses are evaluated; any other node (names, calls, attributes, subscripts,
comparisons, ...) is refused. Limits keep a hostile expression cheap: its length, its number of
nodes, the size of every intermediate integer (bits) and of an exponent.
"""

from __future__ import annotations

import ast
import math
import operator

MAX_CHARS = 200  # longest expression accepted
MAX_NODES = 100  # syntax-tree nodes
MAX_BITS = 256  # largest intermediate integer (about 77 decimal digits)
MAX_EXPONENT = 256

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _check_size(x):
    if isinstance(x, int) and x.bit_length() > MAX_BITS:
        raise ValueError(f"a number larger than 2**{MAX_BITS}")
    if isinstance(x, float) and not math.isfinite(x):
        raise ValueError("the result is not a finite number")
    return x


def _power(a, b):
    if abs(b) > MAX_EXPONENT:
        raise ValueError(f"an exponent larger than {MAX_EXPONENT}")
    if isinstance(a, int) and isinstance(b, int) and b > 0 and a.bit_length() * b > MAX_BITS:
        raise ValueError(f"a number larger than 2**{MAX_BITS}")
    if a == 0 and b < 0:
        raise ValueError("zero to a negative power")
    return a ** b


def _eval(node):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _check_size(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        a, b = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Div) and b == 0:
            raise ValueError("division by zero")
        try:
            if isinstance(node.op, ast.Pow):
                return _check_size(_power(a, b))
            return _check_size(_BINARY[type(node.op)](a, b))
        except OverflowError:
            raise ValueError("the result is too large") from None
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    raise ValueError(f"only numbers, + - * / ** and parentheses are allowed (found {type(node).__name__})")


def evaluate_arithmetic(expression: str) -> int | float:
    """The value of ``expression``; ValueError naming what is not allowed or too large."""
    if not isinstance(expression, str):
        raise ValueError(f"the expression must be text, not {type(expression).__name__}")
    text = expression.strip().replace("×", "*").replace("^", "**")
    if len(text) > MAX_CHARS:
        raise ValueError(f"the expression is longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise ValueError(f"the expression has more than {MAX_NODES} parts")
    value = _eval(tree.body)
    if isinstance(value, complex):  # a negative number to a fractional power
        raise ValueError("the result is not a real number")
    return value


def format_number(value: int | float) -> str:
    """An integer as its digits; a float that is an integer likewise, else 12 significant digits."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 53:
        return str(int(value))
    return str(value) if isinstance(value, int) else f"{value:.12g}"


def calc(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: The arithmetic expression, with numbers, + - * / ** and parentheses, for example "12 * 34".

    Returns:
        The value of the expression.
    """
    return format_number(evaluate_arithmetic(expression))
