"""Supervised fine-tuning (``grpo sft``) on the infrastructure of ``grpo train``: the same model loading
(hub id, folder, run folder, the embedded default; LoRA / QLoRA), optimizer, schedule and clipped step,
run folder, metrics.jsonl and checkpoints, and a ``final/`` folder (LoRA merged) that ``grpo train
model=RUN/final`` starts from. RL starts from a model that already writes the format (DeepSeekMath
starts RL from its instruction-tuned model, section 4).

The loss is the mean negative log-likelihood of the trained tokens of the step's batch (data.py says
which: the assistant's turns), each micro-batch's summed NLL divided by the batch's trained tokens, so
the gradient does not depend on how the batch is cut into micro-batches.

Dimension letters: b rows of a micro-batch, L their padded length, K trained tokens, V vocabulary.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from grpo.infra.checkpoint import save_checkpoint
from grpo.infra.logger import RunLogger
from grpo.infra.runtime import seed_everything
from grpo.models import keep_head_fp32, load_models, native_bf16
from grpo.sft.data import SFTExample, load_examples
from grpo.train.optim import Schedule, adamw, clipped_step, lr_lambda


@dataclass(frozen=True)
class SFTModelSettings:
    """What to load (the fields of the same name in the config)."""

    model: str
    dtype: str = "float32"
    bf16: bool | None = None
    use_peft: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: str = "all-linear"
    load_in_4bit: bool = False
    gradient_checkpointing: bool = False


@dataclass(frozen=True)
class SFTSettings:
    """The run: data, batches, optimizer and schedule, and what is written where."""

    data: str
    run_dir: Path
    epochs: float = 3.0
    batch_size: int = 8
    micro_batch: int | None = None
    max_length: int = 1024
    eval_share: float = 0.0
    learning_rate: float = 3e-5
    lr_scheduler_type: str = "constant"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    max_grad_norm: float = 1.0
    seed: int = 0
    save_steps: int = 0
    save_total_limit: int = 0
    logging_steps: int = 1
    tensorboard: bool = True
    progress: bool = True


def pad_batch(rows: list[SFTExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ids [b, L], attention mask [b, L] and the mask of trained tokens [b, L]."""
    length = max(len(r.ids) for r in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)  # [b, L]
    attn = torch.zeros(len(rows), length, dtype=torch.long)  # [b, L]
    trained = torch.zeros(len(rows), length, dtype=torch.bool)  # [b, L]
    for i, r in enumerate(rows):
        ids[i, :len(r.ids)] = torch.tensor(r.ids)
        attn[i, :len(r.ids)] = 1
        trained[i, :len(r.ids)] = torch.tensor(r.trained)
    return {"ids": ids, "attn": attn, "trained": trained}


def summed_nll(model, batch: dict[str, torch.Tensor], *, autocast: bool) -> torch.Tensor:
    """Sum over the trained tokens (position 0 excluded: nothing predicts it) of -log p(token | before)."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=batch["ids"], attention_mask=batch["attn"]).logits[:, :-1]  # [b, L-1, V]
    sel = batch["trained"][:, 1:]  # [b, L-1] the token at t + 1 is predicted at t
    picked = logits[sel].float()  # [K, V]
    return torch.nn.functional.cross_entropy(picked, batch["ids"][:, 1:][sel], reduction="sum")  # []


class SFTRun:
    """One supervised run: the model, its data (a seeded held-out share), the optimizer and schedule."""

    def __init__(self, models: SFTModelSettings, settings: SFTSettings, *, note=print):
        s, self.s, self.note = settings, settings, note
        seed_everything(s.seed)
        self.models = load_models(models.model, dtype=models.dtype, need_reference=False,
                                  lora_r=models.lora_r if models.use_peft else 0, lora_alpha=models.lora_alpha,
                                  lora_dropout=models.lora_dropout, lora_target_modules=models.lora_target_modules,
                                  load_in_4bit=models.load_in_4bit)
        self.policy, self.tok = self.models.policy, self.models.tokenizer
        self.policy.train()
        self.amp = models.bf16 if models.bf16 is not None else (native_bf16(torch.device("cpu"))
                                                                  and models.dtype == "float32")
        if self.amp:
            keep_head_fp32(self.policy)
        if models.gradient_checkpointing:
            self.policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        rows = load_examples(s.data, self.tok, max_length=s.max_length)
        order = list(range(len(rows)))
        random.Random(f"sft-eval-{s.seed}").shuffle(order)
        n_eval = int(len(rows) * s.eval_share)
        self.eval_rows = [rows[i] for i in order[:n_eval]]
        self.train_rows = [rows[i] for i in order[n_eval:]]
        self.batches_per_epoch = math.ceil(len(self.train_rows) / s.batch_size)
        self.total_steps = max(1, math.ceil(s.epochs * self.batches_per_epoch))
        params = [p for p in self.policy.parameters() if p.requires_grad]
        self.optimizer = adamw(params, lr=s.learning_rate, betas=(s.adam_beta1, s.adam_beta2),
                               weight_decay=s.weight_decay)
        schedule = Schedule(lr_scheduler_type=s.lr_scheduler_type, warmup_steps=s.warmup_steps,
                            max_steps=self.total_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(schedule, per_step=1))
        self.step = 0

    def batch_order(self) -> list[list[int]]:
        """Every step's rows: each epoch a seeded shuffle of the training rows cut into batches."""
        out: list[list[int]] = []
        epoch = 0
        while len(out) < self.total_steps:
            order = list(range(len(self.train_rows)))
            random.Random(f"sft-{self.s.seed}-{epoch}").shuffle(order)
            out += [order[i:i + self.s.batch_size] for i in range(0, len(order), self.s.batch_size)]
            epoch += 1
        return out[:self.total_steps]

    def train_step(self, rows: list[SFTExample]) -> dict:
        """One optimizer step on ``rows``: micro-batches accumulate the summed NLL / the batch's tokens."""
        s, t0 = self.s, time.perf_counter()
        tokens = sum(sum(r.trained[1:]) for r in rows)
        micro = s.micro_batch or len(rows)
        total = 0.0
        for i in range(0, len(rows), micro):
            batch = pad_batch(rows[i:i + micro], self.tok.pad_token_id)
            loss = summed_nll(self.policy, batch, autocast=self.amp) / tokens
            loss.backward()
            total += float(loss.detach())
        norm = clipped_step([p for p in self.policy.parameters() if p.grad is not None], self.optimizer,
                            max_grad_norm=s.max_grad_norm)
        lr = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        return {"loss": total, "grad_norm": norm, "learning_rate": lr, "trained_tokens": tokens,
                "epoch": (self.step + 1) / self.batches_per_epoch, "step_seconds": time.perf_counter() - t0}

    @torch.no_grad()
    def eval_loss(self) -> float | None:
        """Mean NLL per trained token of the held-out rows (None without any)."""
        if not self.eval_rows:
            return None
        self.policy.eval()
        nll, tokens = 0.0, 0
        for i in range(0, len(self.eval_rows), self.s.micro_batch or self.s.batch_size):
            rows = self.eval_rows[i:i + (self.s.micro_batch or self.s.batch_size)]
            nll += float(summed_nll(self.policy, pad_batch(rows, self.tok.pad_token_id), autocast=self.amp))
            tokens += sum(sum(r.trained[1:]) for r in rows)
        self.policy.train()
        return nll / tokens

    def save(self) -> Path:
        state = {"step": self.step, "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}
        return save_checkpoint(self.s.run_dir, self.step, self.policy, self.tok, state, keep=self.s.save_total_limit)

    def train(self) -> dict:
        """Every step, the periodic and final checkpoints; the result (also written to sft.json)."""
        s = self.s
        logger = RunLogger(s.run_dir, total_steps=self.total_steps, tensorboard=s.tensorboard, progress=s.progress)
        truncated = sum(r.truncated for r in self.train_rows + self.eval_rows)
        result = {"train_rows": len(self.train_rows), "eval_rows": len(self.eval_rows), "steps": self.total_steps,
                  "truncated_rows": truncated, "eval_loss_before": self.eval_loss()}
        if truncated:
            logger.note(f"{truncated} rows were longer than sft_max_length={s.max_length} tokens and cut at the end",
                        "yellow")
        first = last = None
        try:
            for rows in self.batch_order():
                metrics = self.train_step([self.train_rows[i] for i in rows])
                self.step += 1
                first = metrics["loss"] if first is None else first
                last = metrics["loss"]
                if self.step % s.logging_steps == 0 or self.step == self.total_steps:
                    logger.log_step(self.step, metrics)
                if s.save_steps and self.step % s.save_steps == 0 and self.step < self.total_steps:
                    self.save()
            result["checkpoint"] = str(self.save())
        finally:
            logger.close()
        result.update(train_loss_first=first, train_loss_last=last, eval_loss_after=self.eval_loss())
        (s.run_dir / "sft.json").write_text(json.dumps(result, indent=2))
        return result
