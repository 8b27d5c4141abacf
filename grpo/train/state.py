"""What a run's checkpoint holds besides the weights, and how a trainer is put back from one.

``trainer_state`` gathers everything the next step depends on: the state of each component the trainer
lists in ``Trainer.components`` (collector: sampler position and reward counters; updater: optimizer,
schedule, skip counters; knobs: controllers and fuse; critic), RNG states, and the reference once
iterative GRPO has reset it. ``restore`` puts all of it back so the next step equals the one the
uninterrupted run would have taken.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from safetensors.torch import load_file

from grpo.errors import CheckpointError, ConfigError, DataError
from grpo.infra.checkpoint import STATE_FILE, find_latest, load_state, rng_state, set_rng_state
from grpo.infra import distributed
from grpo.infra.logger import trim_step_logs


# the settings that decide the held-out split and so which prompts the sampler's saved position points
# at: a resumed run keeps them
SPLIT_KEYS = ("task", "task_split", "prompt_field", "answer_field", "eval_prompts", "arithmetic_max_operand",
              "arithmetic_ops")


def check_resumable(checkpoint: Path, settings: dict) -> None:
    """A ConfigError naming each of SPLIT_KEYS whose value in ``settings`` (the resumed run's config, as
    a dict) differs from the config.yaml of the run that wrote ``checkpoint`` (its run folder:
    checkpoints/step-N's grandparent), with how to resume; nothing to compare (a checkpoint outside a
    run folder) passes."""
    saved_path = Path(checkpoint).parent.parent / "config.yaml"
    try:
        saved = yaml.safe_load(saved_path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return
    changed = [(k, saved[k], settings.get(k)) for k in SPLIT_KEYS if k in saved and saved[k] != settings.get(k)]
    if changed:
        what = "; ".join(f"{k} was {old!r}, now {new!r}" for k, old, new in changed)
        raise ConfigError(f"{', '.join(k for k, _, _ in changed)}: cannot change on resume ({what} against "
                          f"{saved_path}): the held-out split and the prompt stream the checkpoint continues depend "
                          f"on it. Resume without changing it, or start a new run in another output_dir")


def trainer_state(t) -> dict:
    """Everything besides the policy weights that the next step depends on: each component's state
    under its name (Trainer.components), the step, the RNG states, and the reference once iterative
    GRPO has reset it."""
    state = {"step": t.step, "rng": rng_state(), "ref_reset_at": t.ref_reset_at, "model": t.settings.model,
             # the schedule counts optimizer steps: this many per training step
             "optimizer_steps_per_step": t.settings.update.num_iterations * t.settings.update.mini_batches}
    state.update({name: part.state_dict() for name, part in t.components().items()})
    if t.ref_reset_at and t.models.reference is not None:
        # the reference is no longer the initial model: its weights are part of the run's state
        ref = t.models.reference
        state["reference"] = distributed.full_model_state(ref) if t.sharded else ref.state_dict()
    return state


def resume_path(target: str | None, run_dir: Path) -> Path | None:
    """The checkpoint to resume from: None (fresh start), "auto" (this run's latest, if any), a checkpoint
    folder, or a run folder (its latest)."""
    if target is None:
        return None
    if target == "auto":
        if not (run_dir / "checkpoints" / "latest").exists():
            return None  # nothing to resume yet: a fresh start, by request
        return find_latest(run_dir)
    p = Path(target)
    if (p / STATE_FILE).is_file():
        return p
    return find_latest(p)


def _by_component(state: dict) -> dict:
    """A checkpoint's state by component; one written before the state was kept per component (a flat
    dict with "sampler", "optimizer", ... and "stateful") is regrouped, so such runs still resume."""
    if "collector" in state or "sampler" not in state:
        return state
    flat = dict(state)
    out = {k: flat.pop(k) for k in ("step", "rng", "ref_reset_at", "model", "optimizer_steps_per_step",
                                     "reference", "critic") if k in flat}
    out["collector"] = {k: flat[k] for k in ("sampler", "reward_failures", "logged_failures", "reward_timeouts")}
    out["updater"] = {k: flat[k] for k in ("optimizer", "scheduler", "skipped_updates", "consecutive_skips")}
    out["knobs"] = flat.get("stateful", {}).get("stability", {})
    return out


def load_policy_weights(policy, ckpt: Path, *, peft: bool, sharded: bool) -> None:
    """The checkpoint's weights into ``policy``: its LoRA adapters (``peft``), each process's shard of
    the full weights (``sharded``, FSDP2), or the whole model; weights that do not fit are an error
    naming the checkpoint."""
    files = sorted(ckpt.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{ckpt}: no *.safetensors weights")
    weights = {}
    for f in files:
        weights.update(load_file(str(f)))
    if peft:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(policy, weights)
    elif sharded:
        distributed.load_full_model_state(policy, weights)
    else:
        missing, unexpected = policy.load_state_dict(weights, strict=False)
        if unexpected or [k for k in missing if "lm_head" not in k]:
            raise CheckpointError(f"{ckpt}: weights do not match the model "
                                  f"(missing {missing[:3]}, unexpected {unexpected[:3]})")


def restore(t, ckpt: Path) -> None:
    """Load weights and state from a checkpoint so the next step is the one the uninterrupted
    run would have taken; log lines written after it (by a run that later died) are dropped
    (``trim_step_logs``)."""
    state = _by_component(load_state(ckpt))
    if state.get("model") != t.settings.model:
        raise CheckpointError(f"{ckpt}: was trained from model {state.get('model')!r}, "
                              f"but this config's model is {t.settings.model!r}")
    per_step = t.settings.update.num_iterations * t.settings.update.mini_batches
    if state.get("optimizer_steps_per_step", per_step) != per_step:
        raise CheckpointError(
            f"{ckpt}: was trained with {state['optimizer_steps_per_step']} optimizer steps per training step, "
            f"this config takes {per_step} (num_iterations x mini_batches); the learning-rate schedule counts "
            f"optimizer steps, so resume with the values the run started with")
    load_policy_weights(t.policy, ckpt, peft=t.settings.use_peft, sharded=t.sharded)
    if "reference" in state:
        if t.sharded:
            distributed.load_full_model_state(t.models.reference, state["reference"])
        else:
            t.models.reference.load_state_dict(state["reference"])
    for name, part in t.components().items():
        if name not in state:
            raise CheckpointError(f"{ckpt}: holds no state for {name!r}, which this config uses")
        try:
            part.load_state_dict(state[name])
        except DataError as e:  # the sampler's: the run's data file changed since the checkpoint
            raise CheckpointError(f"{ckpt}: {e}; resume with the data the run started with") from None
        except (KeyError, ValueError, RuntimeError) as e:  # written under other settings (a controller,
            # the fuse, LoRA's rank, the critic's model): say which part does not fit
            raise CheckpointError(f"{ckpt}: the state of {name!r} does not fit this config ({type(e).__name__}: "
                                  f"{e}); resume with the settings the run started with") from None
    t.step, t.ref_reset_at = state["step"], state["ref_reset_at"]
    set_rng_state(state["rng"])
    if t.world.is_main:
        cut = trim_step_logs(t.run_dir, t.step)
        if cut:  # the run was killed while writing them
            print(f"resuming {t.run_dir}: dropped a last line cut short in {', '.join(cut)}", flush=True)
    t.resumed_from = ckpt
