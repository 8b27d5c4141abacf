"""``grpo sft``'s run: the supervised training and its ``final/`` folder (the CLI builds the settings
from the config and makes the run folder)."""

from __future__ import annotations

from grpo.infra import distributed
from grpo.sft.settings import SFTModelSettings, SFTSettings
from grpo.sft.trainer import SFTRun


def run_sft(models: SFTModelSettings, settings: SFTSettings, *, world: distributed.World | None = None) -> dict:
    """Train as the settings say; the result holds the run folder, the losses and, on the main
    process of a run that finished, ``final`` (the folder ``grpo train model=...`` takes: full
    weights, LoRA merged, over the base model named by the run folder's config.yaml, which the CLI
    writes before the run). A stopped run (``interrupted``) has its checkpoint and no final folder."""
    from grpo.serve.models import export

    world = world or distributed.World()
    run = SFTRun(models, settings, world=world)
    if run.resumed_from is not None and world.is_main:
        print(f"resumed from {run.resumed_from} at step {run.step}", flush=True)
    result = run.train()
    result["run_dir"] = str(settings.run_dir)
    if world.is_main and "interrupted" not in result:
        result["final"] = str(export(str(settings.run_dir), settings.run_dir / "final"))
    distributed.barrier(world)  # no process leaves (and closes the group) before the final folder is written
    return result
