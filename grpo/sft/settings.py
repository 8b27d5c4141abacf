"""What ``grpo sft`` reads from the config: the model to load and the run (each field is the Config
field named in its comment; the CLI builds both from the config)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SFTModelSettings:
    """What to load (the fields of the same name in the config)."""

    model: str  # model: hub id, folder, run folder or the embedded default
    dtype: str = "float32"  # dtype: the parameters'
    bf16: bool | None = None  # bf16: autocast (None: where the device has native bf16 and dtype is float32)
    use_peft: bool = False  # use_peft: train LoRA adapters instead of the weights
    lora_r: int = 16  # lora_r: the adapters' rank
    lora_alpha: int = 32  # lora_alpha: the adapters' scale numerator
    lora_dropout: float = 0.0  # lora_dropout: dropout on the adapters' input
    lora_target_modules: str = "all-linear"  # lora_target_modules: which linear layers get adapters
    load_in_4bit: bool = False  # load_in_4bit: QLoRA's 4-bit NF4 base
    chat_template_kwargs: dict | None = None  # chat_template_kwargs: the chat template's variables
    gradient_checkpointing: bool = False  # gradient_checkpointing: recompute activations in the backward


@dataclass(frozen=True)
class SFTSettings:
    """The run: data, batches, optimizer and schedule, and what is written where."""

    data: str  # sft_data: the .jsonl / .json file of rows
    run_dir: Path  # output_dir: the run folder (made by the CLI)
    micro_batch: int | None  # per_device_train_batch_size: rows (packed rows with packing) per forward (None: batch_size)
    epochs: float = 3.0  # sft_epochs: passes over the training rows
    batch_size: int = 8  # sft_batch_size: rows per optimizer step, over all processes
    max_length: int = 1024  # sft_max_length: tokens kept per row, and per packed row
    packing: bool = False  # sft_packing: a step's rows packed into rows of at most max_length tokens
    eval_share: float = 0.0  # sft_eval_share: share of the rows held out
    learning_rate: float = 3e-5  # learning_rate
    lr_scheduler_type: str = "constant"  # lr_scheduler_type
    warmup_steps: int = 0  # warmup_steps
    weight_decay: float = 0.0  # weight_decay
    adam_beta1: float = 0.9  # adam_beta1
    adam_beta2: float = 0.999  # adam_beta2
    max_grad_norm: float = 1.0  # max_grad_norm: clip the gradient's norm to it (0: no clipping)
    seed: int = 0  # seed: the held-out draw, the order of the rows, torch's RNG
    save_steps: int = 0  # save_steps: a checkpoint every this many steps (0: only at the end)
    save_total_limit: int = 0  # save_total_limit: keep the newest this many checkpoints (0: all)
    resume_from_checkpoint: str | None = None  # resume_from_checkpoint: 'auto', a run or checkpoint folder
    logging_steps: int = 1  # logging_steps: a metrics line every this many steps
    report_to: tuple[str, ...] = ("tensorboard",)  # report_to: the trackers (infra/trackers.py) of each metrics line
    progress: bool = True  # progress: the live progress bar
