"""The code style reward, by hand (seed 003 section 5.1)."""

from __future__ import annotations

import pytest

from grpo.rewards.builtin import REWARDS
from grpo.rewards.code_style import style_checks, style_score

FULL = '''
def area(w: float, h: float) -> float:
    """Area of a w x h rectangle."""
    if w < 0 or h < 0:
        raise ValueError("negative side")
    return w * h
'''
HALF = '''
class Box:
    def size(self, k: int) -> int:
        """Scaled size."""
        try:
            return 2 * k
        except TypeError:
            return 0

def bare(x, *rest):
    return x
'''


@pytest.mark.parametrize("code,checks,score", [
    (FULL, (1.0, 1.0, 1.0), 1.0),
    # two functions: size is hinted (self excluded) and documented, bare neither; try/except present
    (HALF, (0.5, 0.5, 1.0), 0.4 * 0.5 + 0.3 * 0.5 + 0.3),
    ("def f(x: int):\n    return x\n", (0.0, 0.0, 0.0), 0.0),  # no return annotation: not hinted
    ("def f(x: int, *a: int, **k: str) -> int:\n    return x\n", (1.0, 0.0, 0.0), 0.4),
    ("print(1)\n", (0.0, 0.0, 0.0), 0.0),  # no function
    ("def f(:\n", (0.0, 0.0, 0.0), 0.0),  # does not parse
])
def test_style_checks_by_hand(code, checks, score):
    c = style_checks(code)
    assert (c.hints, c.docstring, c.exceptions) == checks
    assert style_score(code) == pytest.approx(score)


def test_the_reward_reads_the_last_code_block_and_weights_are_checked():
    text = f"Here:\n```python\ndef f(x):\n    return x\n```\nBetter:\n```python\n{FULL}```"
    assert REWARDS["code_style"](text, {}) == pytest.approx(1.0)
    assert style_score(HALF, weights={"hints": 1.0, "docstring": 0.0, "exceptions": 0.0}) == 0.5
    with pytest.raises(ValueError, match="weights"):
        style_score(FULL, weights={"hints": 1.0})
