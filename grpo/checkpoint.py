"""Checkpoints written atomically: into a temporary folder, fsynced, then renamed into place."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path


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


def save_checkpoint(run_dir: Path, step: int, model, tokenizer, state: dict) -> Path:
    """Write checkpoints/step-N (loadable by ``AutoModelForCausalLM.from_pretrained``) and point
    checkpoints/latest at it. A crash mid-write leaves only a ``.tmp-*`` folder, never a half step-N."""
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step}"
    tmp = root / f".tmp-step-{step}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2))
    _fsync_tree(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    pointer_tmp = root / f".latest.tmp-{os.getpid()}"
    pointer_tmp.write_text(final.name + "\n")
    os.replace(pointer_tmp, root / "latest")
    return final
