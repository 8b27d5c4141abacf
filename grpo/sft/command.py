"""``grpo sft``'s run: the supervised training and its ``final/`` folder (the CLI builds the settings
from the config and makes the run folder)."""

from __future__ import annotations

from grpo.sft.trainer import SFTModelSettings, SFTRun, SFTSettings


def run_sft(models: SFTModelSettings, settings: SFTSettings) -> dict:
    """Train as the settings say; the result holds the run folder, the losses and ``final`` (the
    folder ``grpo train model=...`` takes: full weights, LoRA merged, over the base model named by the
    run folder's config.yaml, which the CLI writes before the run)."""
    from grpo.serve.models import export

    run = SFTRun(models, settings)
    result = run.train()
    result["final"] = str(export(str(settings.run_dir), settings.run_dir / "final"))
    result["run_dir"] = str(settings.run_dir)
    return result
