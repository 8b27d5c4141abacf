"""Checkpoints that resume exactly, written atomically.

A checkpoint folder ``checkpoints/step-N/`` holds the policy (``save_pretrained``: full weights, or the
LoRA adapters), the tokenizer, ``trainer_state.pt`` (optimizer, scheduler, counters, sampler position,
every RNG state, the reference's weights when iterative GRPO has reset it) and a readable
``trainer_state.json``. It is written into a temporary folder, fsynced, renamed into place, and only
then is ``checkpoints/latest`` pointed at it (itself written atomically). A crash at any moment
leaves the previous checkpoint and pointer intact.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from grpo.errors import CheckpointError

STATE_FILE = "trainer_state.pt"


def _fsync_tree(folder: Path) -> None:
    for p in folder.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_state() -> dict:
    """Every RNG the run draws from: Python, NumPy, torch CPU (and CUDA when present)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _plain(v) -> bool:
    """Whether ``v`` is JSON as it is (numbers, strings, lists and dicts of them)."""
    if isinstance(v, dict):
        return all(isinstance(k, str) and _plain(x) for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return all(_plain(x) for x in v)
    return v is None or isinstance(v, (int, float, str, bool))


def _readable(state: dict) -> dict:
    """The JSON part of ``state``: its plain values, and of each component's dict (one level down)
    the plain entries (counters, the sampler's position, controller values; no weights or moments)."""
    out = {k: v for k, v in state.items() if _plain(v)}
    for k, v in state.items():
        if k not in out and isinstance(v, dict):
            part = {name: x for name, x in v.items() if isinstance(name, str) and _plain(x)}
            if part:
                out[k] = part
    return out


def save_checkpoint(run_dir: Path, step: int, model, tokenizer, state: dict, *, keep: int = 0,
                    weights: dict | None = None) -> Path:
    """Write checkpoints/step-N atomically, point ``latest`` at it, then prune to the newest ``keep``
    (0 keeps all). ``state`` is pickled with torch.save; its scalar entries also go to JSON. ``weights``
    replaces the model's own state dict (the gathered full weights of a sharded model)."""
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step}"
    tmp = root / f".tmp-step-{step}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    model.save_pretrained(tmp, **({} if weights is None else {"state_dict": weights}))
    tokenizer.save_pretrained(tmp)
    torch.save(state, tmp / STATE_FILE)
    readable = _readable(state)  # step, counters, controller states by component; no tensors
    (tmp / "trainer_state.json").write_text(json.dumps(readable, indent=2))
    _fsync_tree(tmp)
    if final.exists():  # re-saving the same step (e.g. SIGINT right after a periodic save)
        shutil.rmtree(final)
    os.replace(tmp, final)
    pointer_tmp = root / f".latest.tmp-{os.getpid()}"
    pointer_tmp.write_text(final.name + "\n")
    with open(pointer_tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(pointer_tmp, root / "latest")
    if keep:
        for old in list_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old)
    return final


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete step-N folders, oldest first (temporary folders are not checkpoints)."""
    root = run_dir / "checkpoints"
    found = [p for p in root.glob("step-*") if p.is_dir() and p.name[5:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[5:]))


def partial_folders(run_dir: Path) -> list[Path]:
    """Leftovers of writes interrupted by a crash; ignored on resume, and reported."""
    return sorted((run_dir / "checkpoints").glob(".tmp-*"))


def find_latest(run_dir: Path) -> Path:
    """The checkpoint ``latest`` names, checked; any problem is an error naming the path."""
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.is_file():
        raise CheckpointError(f"{pointer}: no checkpoint to resume from (the pointer file is missing)")
    name = pointer.read_text().strip()
    if not name.startswith("step-") or not name[5:].isdigit():
        raise CheckpointError(f"{pointer}: corrupt pointer {name[:80]!r} (expected 'step-N')")
    ckpt = pointer.parent / name
    if not ckpt.is_dir():
        raise CheckpointError(f"{pointer} names {ckpt}, which does not exist")
    if not (ckpt / STATE_FILE).is_file():
        raise CheckpointError(f"{ckpt}: incomplete checkpoint, {STATE_FILE} is missing")
    return ckpt


def newest_checkpoint(run_dir: Path) -> Path | None:
    """A run's newest checkpoint, the one definition of it: the folder ``checkpoints/latest`` names
    (checked, as find_latest does), or, in a run folder without the pointer, its highest complete
    step-N; None when the run has no checkpoint."""
    if (run_dir / "checkpoints" / "latest").exists():
        return find_latest(run_dir)
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def load_state(ckpt: Path) -> dict:
    try:
        return torch.load(ckpt / STATE_FILE, map_location="cpu", weights_only=False)
    except Exception as e:  # a truncated or corrupt file
        raise CheckpointError(f"{ckpt / STATE_FILE}: cannot be read ({type(e).__name__}: {e})") from None
