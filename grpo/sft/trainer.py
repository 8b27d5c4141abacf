"""Supervised fine-tuning (``grpo sft``) on the infrastructure of ``grpo train``: the same model loading
(hub id, folder, run folder, the embedded default; LoRA / QLoRA), optimizer, schedule and clipped step,
torchrun (DDP), run folder, metrics.jsonl and checkpoints that resume exactly, and a ``final/`` folder
(LoRA merged) that ``grpo train model=RUN/final`` starts from. RL starts from a model that already
writes the format (DeepSeekMath starts RL from its instruction-tuned model, section 4).

The loss is the mean negative log-likelihood of the trained tokens of the step's batch (data.py says
which: the assistant's turns): each forward's summed NLL divided by the batch's trained tokens, so the
gradient does not depend on how the batch is cut into micro-batches, packed rows or processes.

Under torchrun every process draws the same batches and trains on its own contiguous share of each
(sizes differing by at most one row); DDP averages the gradients over processes, so each process's
loss is scaled by their number and the average is the one-process gradient of the whole batch.
"""

from __future__ import annotations

import json
import math
import random
import signal
import time
from pathlib import Path

import torch

from grpo.errors import ConfigError
from grpo.infra import distributed
from grpo.infra.checkpoint import rng_state, save_checkpoint
from grpo.infra.logger import NullLogger, RunLogger
from grpo.infra.runtime import seed_everything
from grpo.infra.stop import StopFlag
from grpo.models import keep_head_fp32, load_models, native_bf16
from grpo.sft import state as sft_state
from grpo.sft.batches import micro_batches, pad_batch, packing_isolated, summed_nll
from grpo.sft.data import SFTExample, load_examples
from grpo.sft.settings import SFTModelSettings, SFTSettings
from grpo.train.optim import Schedule, adamw, clipped_step, lr_lambda
from grpo.train.state import resume_path

__all__ = ["SFTModelSettings", "SFTRun", "SFTSettings", "rank_share"]


def rank_share(n: int, world: distributed.World) -> range:
    """This process's contiguous share of ``n`` rows: sizes differ by at most one, lower ranks first."""
    base, extra = divmod(n, world.size)
    start = world.rank * base + min(world.rank, extra)
    return range(start, start + base + (world.rank < extra))


def _load(models: SFTModelSettings, device: torch.device):
    """The policy (LoRA adapters or 4-bit base as configured) on ``device``, and its tokenizer."""
    loaded = load_models(models.model, dtype=models.dtype, need_reference=False,
                         lora_r=models.lora_r if models.use_peft else 0, lora_alpha=models.lora_alpha,
                         lora_dropout=models.lora_dropout, lora_target_modules=models.lora_target_modules,
                         load_in_4bit=models.load_in_4bit, device=device,
                         chat_template_kwargs=models.chat_template_kwargs)
    if device.type != "cpu" and not models.load_in_4bit:  # a 4-bit base loads onto the device
        loaded.policy.to(device)
    return loaded


class SFTRun:
    """One supervised run: the model, its data (a seeded held-out share), the optimizer and schedule."""

    def __init__(self, models: SFTModelSettings, settings: SFTSettings, *, world: distributed.World | None = None,
                 note=print):
        s, self.s, self.note = settings, settings, note
        self.world = world or distributed.World()
        if self.world.distributed and s.batch_size < self.world.size:
            raise ConfigError(f"sft_batch_size: {s.batch_size} rows per step cannot give each of "
                              f"{self.world.size} processes a row; use at least {self.world.size}")
        seed_everything(s.seed)
        self.model_name, self.peft = models.model, models.use_peft
        loaded = _load(models, self.world.device)
        self.policy, self.tok = loaded.policy, loaded.tokenizer
        self.policy.train()
        device = next(self.policy.parameters()).device
        self.amp = models.bf16 if models.bf16 is not None else (native_bf16(device) and models.dtype == "float32")
        if self.amp:
            keep_head_fp32(self.policy)
        if models.gradient_checkpointing:
            self.policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        vocab = min(len(self.tok), self.policy.get_input_embeddings().num_embeddings)
        if s.packing and not packing_isolated(self.policy, vocab):
            raise ConfigError(f"sft_packing: this model's attention ({self.policy.config._attn_implementation}) does "
                              "not keep packed rows apart by their position ids; use sft_packing=false")
        self.module = distributed.wrap_policy(self.policy, self.world, "ddp")  # the training forward's module
        self._split_rows(load_examples(s.data, self.tok, max_length=s.max_length))
        params = [p for p in self.policy.parameters() if p.requires_grad]
        self.optimizer = adamw(params, lr=s.learning_rate, betas=(s.adam_beta1, s.adam_beta2),
                               weight_decay=s.weight_decay)
        schedule = Schedule(lr_scheduler_type=s.lr_scheduler_type, warmup_steps=s.warmup_steps,
                            max_steps=self.total_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(schedule, per_step=1))
        self.step = 0
        self.stop = StopFlag()  # SIGINT / SIGTERM during train()
        self.resumed_from = resume_path(s.resume_from_checkpoint, s.run_dir)
        if self.resumed_from is not None:
            sft_state.restore(self, self.resumed_from)

    def _split_rows(self, rows: list[SFTExample]) -> None:
        """The seeded held-out share and the training rows; the steps they make."""
        s = self.s
        order = list(range(len(rows)))
        random.Random(f"sft-eval-{s.seed}").shuffle(order)
        n_eval = int(len(rows) * s.eval_share)
        self.eval_rows = [rows[i] for i in order[:n_eval]]
        self.train_rows = [rows[i] for i in order[n_eval:]]
        self.batches_per_epoch = math.ceil(len(self.train_rows) / s.batch_size)
        self.total_steps = max(1, math.ceil(s.epochs * self.batches_per_epoch))

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
        """One optimizer step on the batch ``rows`` (every process passes the whole batch and trains
        on its share): each forward adds its summed NLL / the batch's trained tokens."""
        s, w, t0 = self.s, self.world, time.perf_counter()
        tokens = sum(sum(r.trained[1:]) for r in rows)
        mine = [rows[i] for i in rank_share(len(rows), w)]
        weight = float(w.size)  # DDP averages over processes: scaled, the average is the sum
        if not mine:  # the last batch of an epoch, smaller than the processes: a row with weight 0, so
            mine, weight = rows[:1], 0.0  # this process still joins the gradient's all-reduce
        forwards = micro_batches(mine, micro=s.micro_batch or len(mine), pad_id=self.tok.pad_token_id,
                                 packing=s.packing, max_length=s.max_length)
        total = torch.zeros(())
        for k, batch in enumerate(forwards):
            with distributed.grad_sync(self.module, w, enabled=k == len(forwards) - 1):
                nll = summed_nll(self.module, batch, autocast=self.amp) / tokens
                (nll * weight).backward()
            total += nll.detach().float().cpu() * (weight > 0)
        norm = clipped_step([p for p in self.policy.parameters() if p.grad is not None], self.optimizer,
                            max_grad_norm=s.max_grad_norm)
        lr = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        return {"loss": float(distributed.all_sum(total, w)), "grad_norm": norm, "learning_rate": lr,
                "trained_tokens": tokens, "epoch": (self.step + 1) / self.batches_per_epoch,
                "step_seconds": time.perf_counter() - t0}

    @torch.no_grad()
    def eval_loss(self) -> float | None:
        """Mean NLL per trained token of the held-out rows (None without any, or off the main process)."""
        if not self.eval_rows or not self.world.is_main:
            return None
        self.policy.eval()
        nll, tokens = 0.0, 0
        for i in range(0, len(self.eval_rows), self.s.micro_batch or self.s.batch_size):
            rows = self.eval_rows[i:i + (self.s.micro_batch or self.s.batch_size)]
            nll += float(summed_nll(self.policy, pad_batch(rows, self.tok.pad_token_id), autocast=self.amp))
            tokens += sum(sum(r.trained[1:]) for r in rows)
        self.policy.train()
        return nll / tokens

    def save(self) -> Path | None:
        """A checkpoint of this step (written by the main process; the others hold the same weights, and
        send it their RNG states: each process draws its own dropout masks)."""
        rngs = distributed.gather_objects(rng_state(), self.world)  # every process takes part
        if not self.world.is_main:
            return None
        return save_checkpoint(self.s.run_dir, self.step, self.policy, self.tok, sft_state.sft_state(self, rngs),
                               keep=self.s.save_total_limit)

    def _should_stop(self) -> bool:
        """A stop signal on any process stops all of them after the same step."""
        flag = distributed.all_max(int(self.stop.signal is not None), self.world)
        if flag and self.stop.signal is None:
            self.stop.signal = "SIGTERM"
        return bool(flag)

    def train(self) -> dict:
        """The steps from the current one, the periodic and final checkpoints; the result (written to
        sft.json when the run ends). A stop signal saves a checkpoint after the step and ends the run
        with ``interrupted`` set; ``resume_from_checkpoint`` continues it."""
        handlers = {sig: signal.signal(sig, self.stop.handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            return self._train()
        finally:
            for sig, h in handlers.items():
                signal.signal(sig, h)

    def _train(self) -> dict:
        s, main = self.s, self.world.is_main
        logger = (RunLogger(s.run_dir, total_steps=self.total_steps, start_step=self.step, report_to=s.report_to,
                            params=_run_config(s.run_dir), progress=s.progress) if main else NullLogger())
        truncated = sum(r.truncated for r in self.train_rows + self.eval_rows)
        result = {"train_rows": len(self.train_rows), "eval_rows": len(self.eval_rows), "steps": self.total_steps,
                  "truncated_rows": truncated, "eval_loss_before": self.eval_loss()}
        if truncated:
            logger.note(f"{truncated} rows were longer than sft_max_length={s.max_length} tokens and cut at the end",
                        "yellow")
        losses = []
        try:
            for rows in self.batch_order()[self.step:]:
                metrics = self.train_step([self.train_rows[i] for i in rows])
                self.step += 1
                losses.append(metrics["loss"])
                if self.step % s.logging_steps == 0 or self.step == self.total_steps:
                    logger.log_step(self.step, metrics)
                if self.step < self.total_steps and self._should_stop():
                    result["interrupted"] = self.stop.signal
                    break
                if s.save_steps and self.step % s.save_steps == 0 and self.step < self.total_steps:
                    self.save()
            result["checkpoint"] = str(self.save())
        finally:
            logger.close()
        result.update(step=self.step, train_loss_first=losses[0] if losses else None,
                      train_loss_last=losses[-1] if losses else None)
        if "interrupted" not in result:
            result["eval_loss_after"] = self.eval_loss()
            if main:
                (s.run_dir / "sft.json").write_text(json.dumps(result, indent=2))
        return result


def _run_config(run_dir: Path) -> dict:
    """The run's config.yaml (written before the run starts), which each tracker records once; {} without it."""
    import yaml

    path = Path(run_dir) / "config.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}
