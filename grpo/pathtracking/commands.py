"""``grpo control train`` and ``grpo control compare`` (the CLI delegates here)."""

from __future__ import annotations

import argparse
import platform
import subprocess
import time
from pathlib import Path

from grpo.errors import ConfigError
from grpo.registry import Registry

# name -> (argv after it) -> exit code, each registered with its line of the usage
SUBCOMMANDS: Registry = Registry("control command")  # the CLI prefixes "grpo control: "

DEFAULT_STEPS = 20_000  # env steps per run of `compare`: its 30 runs fit 20 minutes on 2 contended cores
DEFAULT_THRESHOLD = 60.0  # a training return of 60 of the about 100 a perfect 100-step episode earns


def usage() -> str:
    """The help of ``grpo control``: every subcommand with its line."""
    return (f"usage: grpo control {{{','.join(SUBCOMMANDS)}}} [options]\n\n"
            + "\n".join(f"  {e.name:<8} {e.doc}" for e in SUBCOMMANDS.entries()))


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    return SUBCOMMANDS[argv[0]](argv[1:])


def _overrides(pairs: list[str]) -> dict[str, str]:
    out = {}
    for p in pairs:
        if "=" not in p:
            raise ConfigError(f"expected key=value, got {p!r}")
        k, v = p.split("=", 1)
        out[k] = v
    return out


def train(argv: list[str]) -> int:
    from grpo.pathtracking.agents import AGENTS, make_agent, settings_from
    from grpo.pathtracking.evaluate import evaluate
    from grpo.pathtracking.nets import save_policy
    from grpo.pathtracking.rollout import policy_controller

    ap = argparse.ArgumentParser(prog="grpo control train", description="Train a path-tracking controller.")
    ap.add_argument("--algo", default="grpo", choices=list(AGENTS))
    ap.add_argument("--episodes", type=int, help="training episodes (default: the setting episodes=3000)")
    ap.add_argument("--env-steps", type=int, help="stop after this many environment steps instead")
    ap.add_argument("--out", default=None, help="policy file (default: runs/control/ALGO.pt)")
    ap.add_argument("overrides", nargs="*", metavar="key=value", help="ControllerSettings fields, e.g. lr=1e-3")
    args = ap.parse_args(argv)
    settings = settings_from(_overrides(args.overrides))
    agent = make_agent(args.algo, settings, log=lambda m: print(m, flush=True))
    t0 = time.perf_counter()
    agent.train(episodes=args.episodes, env_steps=args.env_steps)
    res = evaluate(policy_controller(agent.policy, greedy=True))
    path = save_policy(agent.policy, args.out or f"runs/control/{args.algo}.pt", algo=args.algo)
    print(f"trained {agent.episodes_done} episodes, {agent.counter.steps} env steps in "
          f"{time.perf_counter() - t0:.1f} s; held-out: return {res.mean_return:.2f}, RMS lateral error "
          f"{res.rms_lateral:.3f} m, completion {res.completion:.0%}; policy saved to {path}")
    return 0


SUBCOMMANDS.register("train", train, doc="train one controller on grpo/PathTracking-v0 (--algo grpo|grpo_step|ppo|trpo), save its policy")


def compare(argv: list[str]) -> int:
    from grpo.pathtracking.agents import AGENTS
    from grpo.pathtracking.compare import baseline, run_all, write
    from grpo.pathtracking.references import REFERENCES

    ap = argparse.ArgumentParser(prog="grpo control compare",
                                 description="GRPO, PPO, TRPO, SB3 PPO and sb3-contrib TRPO on one budget.")
    ap.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="env steps per run")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2, help="runs in parallel, one process each")
    ap.add_argument("--algos", default=",".join([*AGENTS, *REFERENCES]))
    ap.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD)
    ap.add_argument("--out", default="runs/control-compare")
    args = ap.parse_args(argv)
    algos = [a for a in args.algos.split(",") if a]
    bad = [a for a in algos if a not in AGENTS and a not in REFERENCES]
    if bad:
        raise ConfigError(f"--algos: unknown {bad}; valid: {[*AGENTS, *REFERENCES]}")
    t0 = time.perf_counter()
    print(f"{len(algos)} algorithms x {args.seeds} seeds x {args.steps} env steps, {args.workers} workers", flush=True)
    results = run_all(algos, args.seeds, args.steps, args.threshold, workers=args.workers, out=args.out,
                      log=lambda m: print(m, flush=True))
    base = baseline()
    meta = {"steps": args.steps, "seeds": args.seeds, "workers": args.workers, "wall_s": time.perf_counter() - t0,
            "machine": platform.processor() or platform.machine(), "commit": _commit(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    text = write(results, base, Path(args.out), threshold=args.threshold, meta=meta)
    print(f"\n{text}\n\ntotal wall time {meta['wall_s']:.0f} s; files in {args.out}/ (table.md, results.json, "
          "learning_curves.png, trajectory.png, policies/)")
    return 0


SUBCOMMANDS.register("compare", compare, doc="every algorithm and SB3 PPO / sb3-contrib TRPO on one env-step budget, several seeds")


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
