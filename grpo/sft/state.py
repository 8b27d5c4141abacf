"""What an ``grpo sft`` checkpoint holds besides the weights, and how a run is put back from one.

The next step depends on the weights, the optimizer's moments, the schedule's position, the RNG
states (LoRA dropout draws from torch's) and which rows it trains on. The rows of every step follow
from the seed, the data and the batch size (SFTRun.batch_order), so the step count is the position
in the data; the checkpoint records the seed, the batch size and a digest of the data so a resume
under other ones is refused rather than continued on other rows.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from grpo.errors import CheckpointError
from grpo.infra.checkpoint import load_state, set_rng_state
from grpo.infra.logger import trim_step_logs
from grpo.train.state import load_policy_weights


def data_digest(path: str | Path) -> str:
    """The SHA-256 of the data file's bytes: the rows a checkpoint's step count indexes into."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def sft_state(run, rngs: list) -> dict:
    """Everything besides the weights that the next step of ``run`` (an SFTRun) depends on; ``rngs``:
    every process's RNG states, in rank order."""
    s = run.s
    return {"step": run.step, "optimizer": run.optimizer.state_dict(), "scheduler": run.scheduler.state_dict(),
            "rng": rngs, "model": run.model_name, "seed": s.seed, "sft_batch_size": s.batch_size,
            "sft_data": data_digest(s.data), "sft_eval_share": s.eval_share, "sft_max_length": s.max_length}


def _check_same_run(state: dict, run, ckpt: Path) -> None:
    """A resume trains on the rows the checkpoint's step count stands for, from the same model."""
    s = run.s
    if state.get("model") != run.model_name:
        raise CheckpointError(f"{ckpt}: was trained from model {state.get('model')!r}, but this config's model "
                              f"is {run.model_name!r}")
    if state.get("sft_data") != data_digest(s.data):
        raise CheckpointError(f"{ckpt}: sft_data: {s.data} is not the data the run started with (its content "
                              "changed); resume with that data")
    for field, now in (("seed", s.seed), ("sft_batch_size", s.batch_size), ("sft_eval_share", s.eval_share),
                       ("sft_max_length", s.max_length)):
        if state.get(field) != now:
            raise CheckpointError(f"{ckpt}: {field}: the run started with {state.get(field)!r}, this config has "
                                  f"{now!r}; the rows of each step follow from it, so resume with the same value")


def restore(run, ckpt: Path) -> None:
    """Weights, optimizer, schedule, RNG and step from ``ckpt``, so the next step is the one the
    uninterrupted run would have taken; metrics lines written after it (by a run that later died)
    are dropped (on the main process, which writes them)."""
    state = load_state(ckpt)
    _check_same_run(state, run, ckpt)
    load_policy_weights(run.policy, ckpt, peft=run.peft, sharded=False)
    try:
        run.optimizer.load_state_dict(state["optimizer"])
        run.scheduler.load_state_dict(state["scheduler"])
    except (KeyError, ValueError, RuntimeError) as e:  # LoRA's rank or targets changed
        raise CheckpointError(f"{ckpt}: the optimizer state does not fit this model ({type(e).__name__}: {e}); "
                              "resume with the settings the run started with") from None
    run.step = state["step"]
    rngs = state["rng"]  # one per process; resumed on another number of processes, each takes rank 0's
    set_rng_state(rngs[run.world.rank] if len(rngs) == run.world.size else rngs[0])
    if run.world.is_main:
        cut = trim_step_logs(run.s.run_dir, run.step)
        if cut:
            run.note(f"resuming {run.s.run_dir}: dropped a last line cut short in {', '.join(cut)}")
