"""``grpo sft``: the config's fields into the SFT settings, the run, and its ``final/`` folder."""

from __future__ import annotations

from pathlib import Path

from grpo.errors import ConfigError
from grpo.infra.runtime import make_run_dir
from grpo.sft.trainer import SFTModelSettings, SFTRun, SFTSettings


def model_settings(cfg) -> SFTModelSettings:
    return SFTModelSettings(model=cfg.model, dtype=cfg.dtype, bf16=cfg.bf16, use_peft=cfg.use_peft, lora_r=cfg.lora_r,
                            lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                            lora_target_modules=cfg.lora_target_modules, load_in_4bit=cfg.load_in_4bit,
                            gradient_checkpointing=cfg.gradient_checkpointing)


def sft_settings(cfg, run_dir: Path) -> SFTSettings:
    return SFTSettings(data=cfg.sft_data, run_dir=run_dir, epochs=cfg.sft_epochs, batch_size=cfg.sft_batch_size,
                       micro_batch=cfg.per_device_train_batch_size, max_length=cfg.sft_max_length,
                       eval_share=cfg.sft_eval_share, learning_rate=cfg.learning_rate,
                       lr_scheduler_type=cfg.lr_scheduler_type, warmup_steps=cfg.warmup_steps,
                       weight_decay=cfg.weight_decay, adam_beta1=cfg.adam_beta1, adam_beta2=cfg.adam_beta2,
                       max_grad_norm=cfg.max_grad_norm, seed=cfg.seed, save_steps=cfg.save_steps,
                       save_total_limit=cfg.save_total_limit, logging_steps=cfg.logging_steps,
                       tensorboard=cfg.report_to == "tensorboard", progress=cfg.progress)


def run_sft(cfg) -> dict:
    """Train as ``cfg`` says; the result holds the run folder, the losses and ``final`` (the folder
    ``grpo train model=...`` takes: full weights, LoRA merged)."""
    import torch

    from grpo.serve.models import export

    if not cfg.sft_data:
        raise ConfigError("sft_data: name the .jsonl / .json file of chat or prompt/completion rows to train on")
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    run_dir = make_run_dir(cfg.output_dir, None)
    cfg.save(run_dir / "config.yaml")  # the run's model: the base a LoRA checkpoint is merged into
    run = SFTRun(model_settings(cfg), sft_settings(cfg, run_dir))
    result = run.train()
    result["final"] = str(export(str(run_dir), run_dir / "final"))
    result["run_dir"] = str(run_dir)
    return result
