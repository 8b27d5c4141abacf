"""Reading answers out of text: \\boxed{...} contents, the numbers in a text, number parsing, and
extract_answer (the last box, else the last number). The built-in rewards judge with
mathverify.candidates, which builds on these."""

from __future__ import annotations

import re

# a number as written, with or without thousands separators ('1,234.5' whole, not '1' and '234.5')
NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\d)|-?\d+(?:\.\d+)?")
THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")


def all_boxed(text: str) -> list[str]:
    """Contents of every \\boxed{...} / \\fbox{...} with balanced braces, in order. An unclosed one is
    skipped and the scan goes on after its opening ('\\boxed{1 hmm. Final: \\boxed{2}' gives ['2'])."""
    out, pos = [], 0
    while (m := BOX_OPEN.search(text, pos)) is not None:
        depth, j = 0, m.end() - 1
        while j < len(text):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                break
            j += 1
        if depth != 0:
            pos = m.end()
            continue
        out.append(text[m.end():j])
        pos = j + 1
    return out


def numbers_in(text: str) -> list[str]:
    """Every number in the text, in order, as written."""
    return NUMBER.findall(text)


def parse_number(text: str) -> float | None:
    """A number written with optional thousands separators, sign, decimals, $ or %; else None."""
    t = text.strip().replace("$", "").replace("%", "").rstrip(".")
    if THOUSANDS.fullmatch(t):
        t = t.replace(",", "")
    try:
        return float(t)
    except ValueError:
        return None


def extract_answer(completion: str) -> str | None:
    """The completion's final answer: the last \\boxed{} content, else the last number, else None."""
    boxes = all_boxed(completion)
    if boxes:
        return boxes[-1].strip()
    nums = numbers_in(completion)
    return nums[-1] if nums else None
