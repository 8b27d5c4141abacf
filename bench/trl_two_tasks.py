"""The TRL-form two-task script (examples/trl_two_tasks.py) from a supervised warm-start.

The untrained embedded model never calls the products' `multiply` tool, so RL alone cannot start that
task (its held-out accuracy stays at 0%). This script:

1. writes --transcripts episodes of the script's own training products, each rendered as the script's
   run renders an episode (grpo.agent.AgentSampler over the script's `environment_factory` dict: the
   system message with the tool's description, the worked exchange, the question), then the
   assistant's call `multiply(a=..., b=...)`, the tool turn with the value the script's MultiplyEnv
   returned, and the final answer `a * b = value`;
2. `grpo sft` on them (--epochs, --lr): a light warm-start, so that the tool is called on some of the
   held-out products, not all;
3. runs examples/trl_two_tasks.py, unchanged, from the SFT model (MAX_STEPS, LEARNING_RATE), and prints
   each task's held-out greedy accuracy before and after its GRPO steps.

Every stage is a subprocess, as a user would run it.

    PYTHONPATH=. python bench/trl_two_tasks.py [--out /tmp/trl_two] [--transcripts 32] [--epochs 1] [--lr 2e-5]
        [--steps 10] [--rl-lr 1e-5] [--prompts 8] [--held-out 50] [--seed 0] [--sft SFT_MODEL] [--timeout 7200]

The defaults are the settings under which both tasks rose (docs/benchmarks: Mixtures); the script's own
defaults (4 prompts a step, lr 3e-5, 20 held-out rows per task) are where one task fell.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from transformers import AutoTokenizer

from grpo.agent.formats import call_format
from grpo.agent.sampler import AgentSampler

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "trl_two_tasks.py"


def load_script():
    """The example as a module (its training runs only as __main__)."""
    spec = importlib.util.spec_from_file_location("trl_two_tasks", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def transcripts(script, model: str, n: int) -> list[dict]:
    """``n`` chat rows from the script's training products, rendered as its run renders an episode."""
    tok = AutoTokenizer.from_pretrained(model)
    fmt = call_format("auto", tok)
    sampler = AgentSampler(tok, tools=[], fmt=fmt, max_turns=4, tool_timeout=10.0, example_call="",
                           routes={"calculator": ([], script.MultiplyEnv)}, column="task", strict=True)
    products = [r for r in script.train if r["task"] == "calculator"]
    if n > len(products):
        raise SystemExit(f"--transcripts {n}: the script has {len(products)} training products")
    rows = []
    for sample in products[:n]:
        a, b = sample["prompt"].removeprefix("What is ").removesuffix("?").split(" * ")
        (episode,), _ = sampler.episodes([sample], group_size=1, system_prompt="", max_prompt_length=1 << 20,
                                         keys=None)
        args = {"a": int(a), "b": int(b)}
        parsed = fmt.parse(fmt.render_call("multiply", args), episode.tools)
        value = str(episode.tools["multiply"].fn(**parsed.arguments))
        if value != sample["answer"]:
            raise SystemExit(f"the tool answered {value} for {sample}")
        rows.append({"messages": [*episode.messages, fmt.call_message("multiply", args),
                                  *fmt.result_messages(parsed, value),
                                  {"role": "assistant", "content": f"{a} * {b} = {value}"}]})
    return rows


def run(cmd: list[str], log: Path, env: dict | None = None, timeout: float = 7200.0) -> str:
    try:
        with log.open("w") as err:
            out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env={**os.environ, **(env or {})},
                                 timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{' '.join(map(str, cmd))} ran past {timeout:.0f} s; see {log}") from None
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed ({out.returncode}); see {log}")
    return out.stdout


def warm_start(a, out: Path) -> dict:
    """Stages 1 and 2: the transcripts and ``grpo sft`` on them; its summary (``final``: the model)."""
    data = out / "transcripts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in transcripts(load_script(), a.model, a.transcripts)))
    t0 = time.perf_counter()
    stdout = run([sys.executable, "-m", "grpo.cli", "sft", f"model={a.model}", f"sft_data={data}",
                  f"output_dir={out / 'sft'}", f"sft_epochs={a.epochs}", f"learning_rate={a.lr}",
                  f"num_threads={a.threads}", "progress=false", "report_to=none"], out / "sft.log", timeout=a.timeout)
    if "{" not in stdout:
        raise SystemExit(f"grpo sft printed no summary; see {out / 'sft.log'}: {stdout[-500:]!r}")
    sft = json.loads(stdout[stdout.index("{"):stdout.rindex("}") + 1])
    print(f"sft on {a.transcripts} transcripts: {sft['steps']} steps in {time.perf_counter() - t0:.0f} s, loss "
          f"{sft['train_loss_first']:.3f} -> {sft['train_loss_last']:.3f}", flush=True)
    return sft


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/trl_two_tasks")
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/grpo/SmolLM2-135M-Instruct"))
    ap.add_argument("--transcripts", type=int, default=32)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=2e-5, help="the SFT rate")
    ap.add_argument("--steps", type=int, default=10, help="GRPO steps of the script (its MAX_STEPS)")
    ap.add_argument("--rl-lr", type=float, default=1e-5, help="the script's LEARNING_RATE")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per GRPO step (the script's PROMPTS_PER_STEP)")
    ap.add_argument("--held-out", type=int, default=50, help="held-out rows per task (the script's HELD_OUT)")
    ap.add_argument("--sft", help="an SFT model folder to start from (skips stages 1 and 2)")
    ap.add_argument("--seed", type=int, default=0, help="the script's SEED")
    ap.add_argument("--timeout", type=float, default=7200.0, help="seconds each stage may take")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    sft = {"final": a.sft} if a.sft else warm_start(a, out)
    env = {"OUTPUT_DIR": str(out / "run"), "MAX_STEPS": str(a.steps), "OMP_NUM_THREADS": str(a.threads),
           "LEARNING_RATE": str(a.rl_lr), "PROMPTS_PER_STEP": str(a.prompts), "HELD_OUT": str(a.held_out), "SEED": str(a.seed)}
    print(f"script: {env}", flush=True)
    stdout = run([sys.executable, str(SCRIPT), sft["final"]], out / "script.log", env=env, timeout=a.timeout)
    print(stdout.strip())
    (out / "figures.json").write_text(json.dumps({"sft": sft, "script_stdout": stdout}, indent=2))


if __name__ == "__main__":
    main()
