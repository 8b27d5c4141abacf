"""The README quickstart as a new user runs it, timed from the first command to the report.

The block between README.md's quickstart markers runs as written in a fresh folder, except that every
`grpo train` gets the keys given here appended (a later key=value wins): by default the embedded
SmolLM2-135M-Instruct instead of the block's 360M model (no hub here), 3 steps. Prints the wall time of
the whole block (the data, `grpo train` with its evaluation before and after, `grpo report`), the
evaluation's seconds, accuracy and truncated share before and after, with the CPU and the commit.

    python bench/quickstart.py                                   # the 3-step timing
    python bench/quickstart.py max_steps=25 eval_prompts=50 max_completion_length=256   # a real gain?

Run it alone on the machine: its figure is a wall time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import commit, cpu_line

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_KEYS = ["model=embedded:SmolLM2-135M-Instruct", "max_steps=3"]


def quickstart_block() -> str:
    text = (ROOT / "README.md").read_text()
    block = text[text.index("<!-- quickstart -->"):text.index("<!-- /quickstart -->")]
    return block[block.index("```bash\n") + 8:block.rindex("```")]


def main(argv: list[str]) -> int:
    keys = DEFAULT_KEYS + [a for a in argv if "=" in a]
    work = Path(tempfile.mkdtemp(prefix="grpo-quickstart-"))
    bin_dir = work / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    grpo = bin_dir / "grpo"
    grpo.write_text(f'#!/bin/sh\nif [ "$1" = train ]; then exec "{sys.executable}" -m grpo.cli "$@" {" ".join(keys)}; '
                    f'fi\nexec "{sys.executable}" -m grpo.cli "$@"\n')
    grpo.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    load = os.getloadavg()[0]
    start = time.perf_counter()
    done = subprocess.run(["bash", "-e", "-c", quickstart_block()], cwd=work, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
        return done.returncode
    ev = json.loads((work / "runs" / "products" / "eval.json").read_text())
    print(f"# {cpu_line()}; commit {commit()}; load average before {load:.2f}")
    print(f"quickstart keys appended to grpo train: {' '.join(keys)}")
    print(f"command to report: {seconds:.1f} s")
    for when in ("before", "after"):
        r = ev[when]
        print(f"evaluation {when}: {r['seconds']:.1f} s, {r['n_prompts']} prompts, accuracy {r['accuracy']:.1%}, "
              f"pass@{r['k']} {r['pass@k'] if r['pass@k'] is None else format(r['pass@k'], '.1%')}, "
              f"cut at the token limit {r['truncated_share']:.1%}, mean length {r['mean_length']:.1f} tokens")
    print("\n".join(line for line in done.stdout.splitlines() if not line.startswith("step ")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
