"""Extracting a final answer from a completion: the last \\boxed{...}, else the last number."""

from __future__ import annotations

import re

def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} with balanced braces, or None."""
    start = text.rfind("\\boxed")
    while start != -1:
        i = text.find("{", start)
        if i == -1:
            return None
        depth, j = 0, i
        while j < len(text):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    return text[i + 1:j]
            j += 1
        start = text.rfind("\\boxed", 0, start)
    return None


def numbers_in(text: str) -> list[str]:
    """Every number in the text, in order, as written."""
    return re.findall(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\d)|-?\d+(?:\.\d+)?", text)


def parse_number(text: str) -> float | None:
    """A number written with optional thousands separators, sign, decimals, $ or %; else None."""
    t = text.strip().replace("$", "").replace("%", "").rstrip(".")
    if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", t):
        t = t.replace(",", "")
    try:
        return float(t)
    except ValueError:
        return None


def extract_answer(completion: str) -> str | None:
    """The completion's final answer: the last \\boxed{} content, else the last number, else None."""
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed.strip()
    nums = numbers_in(completion)
    return nums[-1] if nums else None
