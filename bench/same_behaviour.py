"""Does a change keep behaviour? Runs the first steps of the embedded default (`grpo train` with no
arguments, fixed seed) in this tree and in another revision, and compares what they did: every
numeric metric of every step (timings excepted) to --tol, the evaluation results, and the token ids
of every sequence either run decoded (each rollout's completions and each evaluation's answers go
through the tokenizer's ``batch_decode``, whatever module calls it).

    python bench/same_behaviour.py --against 979602f          # exit 0: same behaviour
    python bench/same_behaviour.py --dump out.json            # this tree only

Both runs share one kernel cache folder, so the decode kernels and rollout backend the first run
measured and chose are the ones the second run reads: the choice is not part of what is compared.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# Runs `python -m grpo train ...` with batch_decode recording the ids it is given.
RUNNER = r"""
import atexit, json, runpy, sys
import transformers
seen = []
orig = transformers.PreTrainedTokenizerBase.batch_decode
def batch_decode(self, sequences, *a, **k):
    seen.append([[int(t) for t in row] for row in sequences])
    return orig(self, sequences, *a, **k)
transformers.PreTrainedTokenizerBase.batch_decode = batch_decode
path = sys.argv.pop(1)
atexit.register(lambda: open(path, "w").write(json.dumps(seen)))
sys.argv = ["grpo"] + sys.argv[1:]
runpy.run_module("grpo", run_name="__main__")
"""
TIMING = ("seconds", "tokens_per_second", "elapsed", "time")


def run(tree: Path, out: Path, steps: int, cache: Path, extra: list[str]) -> dict:
    """Train ``steps`` steps from ``tree`` into ``out``; what it logged and decoded."""
    ids_path = out / "decoded.json"
    args = [sys.executable, "-c", RUNNER, str(ids_path), "train", f"max_steps={steps}", "eval_prompts=16",
            "eval_pass_prompts=4", "log_completions_steps=1", f"output_dir={out / 'run'}", "progress=false",
            *extra]
    env = {**os.environ, "PYTHONPATH": str(tree), "GRPO_CACHE": str(cache)}
    proc = subprocess.run(args, cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"run in {tree} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    run_dir = out / "run"
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    evals = json.loads((run_dir / "eval.json").read_text())
    return {"metrics": metrics, "eval": {k: evals.get(k) for k in ("before", "after")},
            "decoded": json.loads(ids_path.read_text())}


def numbers(d: dict, prefix: str = "") -> dict:
    """Flat {name: number} of a (nested) record, timings left out."""
    out = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(numbers(v, name + "."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and not any(t in k for t in TIMING):
            out[name] = float(v)
    return out


def compare(a: dict, b: dict, tol: float) -> list[str]:
    """Every difference between two runs' records."""
    diffs = []
    if len(a["metrics"]) != len(b["metrics"]):
        diffs.append(f"steps logged: {len(a['metrics'])} vs {len(b['metrics'])}")
    for i, (ma, mb) in enumerate(zip(a["metrics"], b["metrics"])):
        na, nb = numbers(ma), numbers(mb)
        for k in sorted(set(na) | set(nb)):
            if k not in na or k not in nb:
                diffs.append(f"step {i + 1}: {k} only in {'after' if k in nb else 'before'}")
            elif not (na[k] == nb[k] or (math.isnan(na[k]) and math.isnan(nb[k]))
                      or abs(na[k] - nb[k]) <= tol * max(1.0, abs(na[k]))):
                diffs.append(f"step {i + 1}: {k} {na[k]!r} vs {nb[k]!r}")
    ea, eb = numbers(a["eval"]), numbers(b["eval"])
    diffs += [f"eval {k}: {ea.get(k)!r} vs {eb.get(k)!r}" for k in sorted(set(ea) | set(eb))
              if ea.get(k) is None or eb.get(k) is None or abs(ea[k] - eb[k]) > tol]
    if a["decoded"] != b["decoded"]:
        n = next((i for i, (x, y) in enumerate(zip(a["decoded"], b["decoded"])) if x != y),
                 min(len(a["decoded"]), len(b["decoded"])))
        diffs.append(f"decoded token ids differ from call {n} ({len(a['decoded'])} vs {len(b['decoded'])} calls)")
    return diffs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", help="git revision to compare this tree with")
    ap.add_argument("--dump", type=Path, help="write this tree's record here")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("overrides", nargs="*", help="extra key=value settings for both runs")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cache = tmp / "cache"
        cache.mkdir()
        from grpo.models.loading import cache_dir, materialize_embedded  # the dequantized default, shared
        (cache / "SmolLM2-135M-Instruct").symlink_to(materialize_embedded(cache_dir() / "SmolLM2-135M-Instruct"))
        records = {}
        if args.against:
            before_tree = tmp / "before"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(before_tree), args.against],
                           check=True, capture_output=True)
            try:
                (tmp / "b").mkdir()
                records["before"] = run(before_tree, tmp / "b", args.steps, cache, args.overrides)
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before_tree)],
                               capture_output=True)
        (tmp / "a").mkdir()
        records["after"] = run(ROOT, tmp / "a", args.steps, cache, args.overrides)
        if args.dump:
            args.dump.write_text(json.dumps(records["after"]))
        if "before" not in records:
            return 0
        diffs = compare(records["before"], records["after"], args.tol)
        calls = len(records["after"]["decoded"])
        rows = sum(len(c) for c in records["after"]["decoded"])
        print(f"compared {args.steps} steps with {args.against}: {len(records['after']['metrics'])} metric records, "
              f"{calls} decode calls ({rows} sequences), eval before/after")
        for d in diffs:
            print("  DIFF", d)
        print("same behaviour" if not diffs else f"{len(diffs)} difference(s)")
        return 1 if diffs else 0


if __name__ == "__main__":
    raise SystemExit(main())
