"""The GRPO loop, top to bottom (DeepSeekMath Algorithm 1).

    every ref_reset_steps steps: reference <- policy               (iterative GRPO)
    each step: sample B prompts -> G completions each -> rewards [B, G] -> advantages
               -> mu passes, each one optimizer step per mini-batch of the clipped objective + beta * KL
                  (gradients accumulated over micro-batches)

Dimension letters: B prompts, G group size, N = B*G sequences, T completion tokens.
Only the trainer knows about the config, devices, the optimizer and the run folder: this file, with
batch.py (a step's batch: advantages, old and reference log-probs) and forwards.py (how a model runs
over a rollout's sequences). Every formula comes from grpo.core.
"""

from __future__ import annotations

import json
import math
import signal
import time
import warnings
from pathlib import Path

import torch

from grpo import core
from grpo.models import grouped_attention
from grpo.infra import checkpoint as ckpt_io
from grpo.infra import distributed as dist_io
from grpo.train import split as passes
from grpo.train.split import mini_batch_rows
from grpo.train import state as resume
from grpo.train import knobs as stab
from grpo.train.collect import dynamic_sample
from grpo.eval.consistency import consistency
from grpo.errors import ConfigError, DataError, FuseError
from grpo.rollout.base import select_rollout
from grpo.config import Config
from grpo.train.critic import Critic
from grpo.train.batch import Batch, prepare_batch
from grpo.data import PromptSampler, load_task, render_prompt
from grpo.eval.evaluate import evaluate
from grpo.train.forwards import Forwards
from grpo.infra.logger import NullLogger, RunLogger
from grpo.models import keep_head_fp32, load_models, native_bf16, reset_reference
from grpo.models.packing import SHARED_PREFIX_ATTENTION, sliding_window
from grpo.rewards.runner import RewardRunner
from grpo.rewards.steps import resolve_step_reward
from grpo.rollout import Rollout, sample_rollout
from grpo.rollout.tuning import take_messages
from grpo.rollout.hf import row_keys
from grpo.infra.runtime import keep_freed_memory, make_run_dir, seed_everything
from grpo.train.optim import adamw, lr_lambda


def _check_world(cfg: Config, world: dist_io.World) -> None:
    """What cannot run on this many processes, refused before anything loads."""
    if cfg.prompts_per_step % world.size:
        raise ConfigError(f"prompts_per_step: {cfg.prompts_per_step} prompts cannot be split evenly over "
                          f"{world.size} processes (each group stays on one process)")
    if (cfg.prompts_per_step // world.size) % cfg.mini_batches:
        raise ConfigError(f"mini_batches: each process's {cfg.prompts_per_step // world.size} prompts cannot be "
                          f"split into {cfg.mini_batches} mini-batches of whole groups")
    if world.distributed and cfg.advantage_estimator == "gae" and cfg.critic_shared_trunk:
        raise ConfigError("critic_shared_trunk: runs on one process only (the value loss's gradients in the "
                          "policy's body would bypass the policy's DDP/FSDP2 wrapper)")


class Trainer:
    def __init__(self, cfg: Config, *, models=None, task=None):
        self.cfg = cfg
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        seed_everything(cfg.seed)
        self.world = dist_io.init_world()  # torchrun's environment, or one process
        world = self.world
        _check_world(cfg, world)
        if cfg.reuse_freed_memory and world.device.type == "cpu":
            keep_freed_memory()
        # Everything that can be wrong with the input is checked before the model loads.
        self.rewards = RewardRunner(cfg.reward_names, cfg.reward_weights, timeout=cfg.reward_timeout,
                                    workers=cfg.reward_workers, reward_model=cfg.reward_model)
        self.step_reward = resolve_step_reward(cfg.step_reward) if cfg.supervision == "process" else None
        self.task = task or load_task(cfg.task, eval_size=cfg.eval_prompts, max_operand=cfg.arithmetic_max_operand,
                                      ops=cfg.arithmetic_ops, prompt_field=cfg.prompt_field,
                                      answer_field=cfg.answer_field, split=cfg.task_split)
        if not self.task.train:
            raise DataError(f"task {cfg.task!r} has no training prompts")
        self.run_dir = dist_io.broadcast_object(make_run_dir(cfg.output_dir, cfg.resume_from_checkpoint) if world.is_main else None, world)
        if world.is_main:
            cfg.save(self.run_dir / "config.yaml")
        self.models = models or load_models(cfg.model, dtype=cfg.dtype, need_reference=cfg.beta > 0,
                                            lora_r=cfg.lora_r if cfg.use_peft else 0, lora_alpha=cfg.lora_alpha,
                                            lora_dropout=cfg.lora_dropout,
                                            lora_target_modules=cfg.lora_target_modules)
        self.policy, self.tok = self.models.policy, self.models.tokenizer
        self._place_models()
        self._build_optimizers()
        self.sampler = PromptSampler(len(self.task.train), seed=cfg.seed)
        self.step = 0
        self.skipped_updates = 0
        self.consecutive_skips = 0
        self.reward_failures = 0
        self.prompts_truncated = 0  # this run's sampled prompts cut to max_prompt_length (every process)
        self.ref_reset_at = 0  # step at which the reference last became a copy of the policy
        self._stop_signal: str | None = None
        self.fuse_reason: str | None = None
        self.resumed_from = None  # the checkpoint this run continues, set by resume.restore
        self.logger = NullLogger()  # train() replaces it with the run's logger on rank 0
        # helpers whose state the next step depends on (controllers, filters): name -> object with
        # state_dict()/load_state_dict(); saved in and restored from every checkpoint
        self.stateful: dict = {}
        self.stability = stab.Stability(cfg)  # the step's knobs (eps, beta, temperature, ...) and their controllers
        if self.stability.controllers or self.stability.fuse is not None:
            self.stateful["stability"] = self.stability
        path = resume.resume_path(cfg.resume_from_checkpoint, self.run_dir)
        if path is not None:
            resume.restore(self, path)

    def _place_models(self) -> None:
        """Policy and reference onto this process's device; bf16 autocast or not; the module the
        training forward runs through; whether groups share one prompt pass."""
        cfg, world = self.cfg, self.world
        self.policy.train()
        if world.device.type != "cpu":
            for m in (self.policy, self.models.reference):
                if m is not None:
                    m.to(world.device)
        device = next(self.policy.parameters()).device
        self.amp = cfg.bf16 if cfg.bf16 is not None else (native_bf16(device) and cfg.dtype == "float32")
        if self.amp:
            for m in (self.policy, self.models.reference):
                if m is not None:
                    keep_head_fp32(m)
        attn = getattr(self.policy.config, "_attn_implementation", None)
        # else one sequence per row; a custom mask would also replace a model's sliding-window mask
        share = cfg.shared_prefix and attn in SHARED_PREFIX_ATTENTION and sliding_window(self.policy.config) is None
        if cfg.gradient_checkpointing:
            self.policy.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            if share and attn == "sdpa":  # the backward's recompute looks the attention function up in the
                # config: it must find the grouped one there too, not only inside the training forward
                self.policy.config._attn_implementation = grouped_attention.register()
        # the module the training forward runs through (DDP wrapper, or the policy sharded in place by
        # FSDP2); self.policy stays the model itself, for generation, LoRA switches and saving
        self.engine = dist_io.wrap_policy(self.policy, world, cfg.distributed_strategy)
        self.sharded = world.distributed and cfg.distributed_strategy == "fsdp2"
        if self.sharded and self.models.reference is not None:
            dist_io.shard(self.models.reference)
        self.forwards = Forwards(group_size=cfg.num_generations, share_prompt=share,
                                 attn_implementation=attn or "sdpa", autocast=self.amp,
                                 max_tokens=cfg.max_tokens_per_forward, sharded=self.sharded,
                                 tied_grad_in_place=not world.distributed)

    def _build_optimizers(self) -> None:
        """AdamW on the trainable parameters with its schedule, and the critic for PPO."""
        cfg = self.cfg
        params = [p for p in self.policy.parameters() if p.requires_grad]  # LoRA: adapters only
        self.optimizer = adamw(params, lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2),
                               weight_decay=cfg.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg))
        self.critic = None
        if cfg.advantage_estimator == "gae":  # the PPO baseline: a learned value model
            self.critic = Critic(self.models.path, dtype=getattr(torch, cfg.dtype),
                                 learning_rate=cfg.critic_learning_rate, clip_range=cfg.cliprange_value,
                                 max_grad_norm=cfg.max_grad_norm, divergence_factor=cfg.critic_divergence_factor,
                                 autocast=self.amp, vf_coef=cfg.vf_coef,
                                 shared_policy=self.policy if cfg.critic_shared_trunk else None,
                                 device=next(self.policy.parameters()).device, world=self.world,
                                 strategy=cfg.distributed_strategy)

    # ---- one step -------------------------------------------------------------------------------
    def sample(self, round: int = 0) -> tuple[list[dict], Rollout]:
        """This process's b = B / world prompts of the step's global draw, G completions each. Each
        row samples from its own key (seed, step, global row), so the tokens do not depend on how
        many processes share the batch; ``round`` numbers the extra draws of one step (dynamic sampling)."""
        cfg, world = self.cfg, self.world
        b, g = cfg.prompts_per_step // world.size, cfg.num_generations
        mine = self.sampler.next(cfg.prompts_per_step)[world.rank * b:(world.rank + 1) * b]
        samples = [self.task.train[i] for i in mine]
        prompts = [render_prompt(self.tok, s["prompt"], cfg.system_prompt) for s in samples]
        keys = row_keys(cfg.seed, self.step, (round * world.size + world.rank) * b * g, b * g)
        ro = sample_rollout(cfg.rollout_backend, self.policy, self.tok, prompts, group_size=g,
                            max_new_tokens=cfg.max_completion_length, temperature=self.stability.temperature,
                            top_p=cfg.top_p, top_k=cfg.top_k, max_prompt_length=cfg.max_prompt_length,
                            with_logprobs=False,  # the loss recomputes them; keeping [N, T, V] logits costs memory
                            keys=keys, synced=self.sharded, kernels=cfg.decode_kernels)
        for msg in take_messages():  # what the rollout measured or read about this machine's kernels, once
            self.logger.note(msg)
        self._count_truncated(int(dist_io.all_sum(torch.tensor(ro.prompts_truncated), world)))
        return samples, ro

    def _count_truncated(self, n: int) -> None:
        """Count prompts cut to max_prompt_length; the first time, say so (they keep their end, the
        generation prompt, and lose their start, which may hold the question)."""
        if n and not self.prompts_truncated:
            self.logger.note(f"{n} prompt(s) longer than max_prompt_length={self.cfg.max_prompt_length} "
                             "tokens were cut from the left (counted in metrics as prompts_truncated)", "yellow")
        self.prompts_truncated += n

    def score(self, samples: list[dict], ro: Rollout) -> tuple[torch.Tensor, dict]:
        """Rewards [B, G] of the whole step, gathered from every process (NaN where a reward
        failed), and the reward metrics."""
        cfg, world = self.cfg, self.world
        group_samples = [s for s in samples for _ in range(cfg.num_generations)]
        res = self.rewards.score(ro.texts, group_samples)
        for msgs in dist_io.gather_objects(res.messages, world):
            for msg in msgs:
                self.logger.note(msg, "yellow")
        total = dist_io.gather_rows(res.total.double(), world)  # [N_global]
        per_reward = {k: dist_io.gather_rows(v.double(), world) for k, v in res.per_reward.items()}
        n_failed = int(torch.isnan(total).sum())
        self.reward_failures += n_failed
        first = per_reward[cfg.reward_names[0]]
        timeouts = int(dist_io.all_sum(torch.tensor(self.rewards.timeouts), world))
        metrics = {f"rewards/{k}": float(torch.nanmean(v)) for k, v in per_reward.items()}
        metrics.update(accuracy=float((first >= 1.0).double().mean()), reward_failures=n_failed,
                       reward_failures_total=self.reward_failures, reward_timeouts_total=timeouts)
        return total.float().view(cfg.prompts_per_step, cfg.num_generations), metrics

    def update(self, batch: Batch) -> dict:
        """mu passes over the batch; each pass takes one optimizer step per mini-batch, accumulating
        its micro-batch gradients."""
        cfg, ro, world = self.cfg, batch.rollout, self.world
        n = ro.completion_ids.shape[0]
        rows = self._trained_rows(batch)  # [n'] the sequences that can have a gradient
        minis = mini_batch_rows(n // cfg.num_generations, cfg.num_generations, cfg.mini_batches)
        # tokens that count in each mini-batch, over all processes: one without any (absent, filtered or
        # failed groups) has no loss and takes no optimizer step, though the schedule moves on
        counts = dist_io.all_sum(torch.stack([batch.mask[m].sum() for m in minis]).double(), world).tolist()
        steps = cfg.num_iterations * sum(c > 0 for c in counts)  # optimizer steps of this update
        acc: dict = {"sums": {}, "tokens": 0.0, "grad_norms": [], "critic": []}
        for _ in range(cfg.num_iterations):
            for mini, count in zip(minis, counts):
                if count == 0:
                    with warnings.catch_warnings():  # before the run's first optimizer step PyTorch warns
                        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
                        self.scheduler.step()
                    continue
                # the loss's denominator is the mini-batch's (tokens or sequences over all processes); DDP
                # and FSDP2 average gradients over processes, so each divides by total / world for a sum
                total = (count if cfg.aggregation == "token_mean" else len(mini) * world.size) / world.size
                live = mini[torch.isin(mini, rows)] if len(rows) < n else mini  # [m'] sequences with a gradient
                self._mini_batch_step(batch, live, total, acc, weight=1.0 / steps)
                if self.critic is not None:  # PPO epochs train the critic on the same mini-batch; with a
                    # shared trunk its value-loss gradients join the policy's before the policy steps
                    acc["critic"].append(self.critic.update(select_rollout(ro, mini), batch.values[mini],
                                                            batch.returns[mini], batch.mask[mini],
                                                            micro_batch=cfg.per_device_train_batch_size))
                acc["grad_norms"].append(self._optimizer_step())
        # token-weighted means and loss shares of every process (each loss share is world x its part)
        sums = acc["sums"]
        keys = sorted(sums)
        summed = dist_io.all_sum(torch.tensor([sums[k] for k in keys] + [acc["tokens"]], dtype=torch.float64), world)
        sums, tokens_seen = dict(zip(keys, summed[:-1].tolist())), float(summed[-1])
        metrics = {k: v / max(tokens_seen, 1.0) for k, v in sums.items() if k not in ("loss", "policy_loss")}
        norms = acc["grad_norms"] or [0.0]
        metrics.update(loss=sums.get("loss", 0.0) / world.size, policy_loss=sums.get("policy_loss", 0.0) / world.size,
                       grad_norm=norms[-1], grad_norm_max=max(norms), optimizer_steps=len(acc["grad_norms"]),
                       trained_sequence_share=len(rows) / max(n, 1),
                       skipped_updates=self.skipped_updates, learning_rate=self.scheduler.get_last_lr()[0])
        if self.critic is not None:
            metrics.update(self.critic.step_metrics(acc["critic"]))
        return metrics

    def _mini_batch_step(self, batch: Batch, rows: torch.Tensor, total, acc: dict, *, weight: float) -> None:
        """Forward and backward passes over one mini-batch's ``rows`` [m], in micro-batches cut into
        passes of bounded size; the gradients accumulate (synced on the last pass). Adds the token-
        weighted metric sums, and the loss times ``weight`` (1 / the update's optimizer steps), to ``acc``."""
        cfg, world, sums = self.cfg, self.world, acc["sums"]
        self.optimizer.zero_grad(set_to_none=True)
        todo = [p for rows_mb in rows.split(cfg.per_device_train_batch_size)
                for p in self.forwards.passes(batch.rollout, rows_mb)]
        for i, idx in enumerate(todo):
            with dist_io.grad_sync(self.engine, world, enabled=i == len(todo) - 1):
                out = self._micro_loss(batch, idx, total)
                out["loss"].backward()
            w = float(batch.mask[idx].sum())  # token weight of this micro-batch's means
            acc["tokens"] += w
            for key in ("kl", "entropy", "ratio_mean", "clip_fraction", "clip_fraction_low", "clip_fraction_high",
                        "cov_token_share"):
                if key in out:
                    sums[key] = sums.get(key, 0.0) + float(out[key]) * w
            sums["loss"] = sums.get("loss", 0.0) + float(out["loss"].detach()) * weight
            sums["policy_loss"] = sums.get("policy_loss", 0.0) + float(out["policy_loss"]) * weight

    def _trained_rows(self, batch: Batch) -> torch.Tensor:
        """The sequences that go through forward and backward: with beta = 0, mu = 1, one mini-batch and no entropy or
        covariance term, those with a non-zero advantage (passes.rows_with_gradient); the loss's
        denominator still counts the others, so the loss is unchanged. All of them on more than one
        process (DDP needs each to run the same micro-batches) and under an entropy target (its
        controller reads the entropy of the whole batch)."""
        cfg, k = self.cfg, self.stability
        if (not cfg.skip_zero_advantage or self.world.distributed or cfg.num_iterations > 1 or cfg.mini_batches > 1
                or k.beta > 0 or k.entropy_coef > 0 or cfg.cov_mode is not None or self.critic is not None
                or cfg.entropy_target_band is not None):
            return torch.arange(batch.mask.shape[0])
        return passes.rows_with_gradient(batch.advantages, batch.mask, group_size=cfg.num_generations)

    def _micro_loss(self, batch: Batch, idx: torch.Tensor, total) -> dict:
        """The objective on micro-batch rows ``idx``, through the (possibly wrapped) policy."""
        cfg, ro, k = self.cfg, batch.rollout, self.stability  # k: this step's knobs (eps, beta, ...)
        cur = self.forwards.logprobs(self.engine, ro, idx, temperature=k.temperature,
                                     with_entropy=k.entropy_coef > 0)
        logp = cur["logp"]  # [n, T]
        old = batch.old_logp[idx] if batch.old_logp is not None else logp.detach()
        out = core.policy_loss(
            logp, old, batch.advantages[idx], batch.mask[idx],
            ref_logp=batch.ref_logp[idx] if batch.ref_logp is not None else None,
            eps_low=k.epsilon, eps_high=k.eps_high, dual_clip=cfg.dual_clip,
            ratio_level=cfg.importance_sampling_level, kl_coef=k.beta if batch.kl_in_loss else 0.0,
            kl_estimator=cfg.kl_estimator,
            aggregation=cfg.aggregation, norm_length=cfg.max_completion_length, total=total,
            entropy=cur["entropy"], entropy_coef=k.entropy_coef, cov_mode=cfg.cov_mode,
            cov_fraction=cfg.cov_fraction, kl_cov_coef=cfg.kl_cov_coef)
        return out

    def _optimizer_step(self) -> float:
        params = [p for p in self.policy.parameters() if p.grad is not None]
        max_norm = self.cfg.max_grad_norm if self.cfg.max_grad_norm > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # FSDP2: a DTensor
        if not math.isfinite(norm):
            self.skipped_updates += 1  # a non-finite gradient never reaches the weights
            self.consecutive_skips += 1
            self.optimizer.zero_grad(set_to_none=True)
            if self.consecutive_skips >= self.cfg.max_consecutive_skips:
                raise FloatingPointError(
                    f"{self.consecutive_skips} consecutive updates had a non-finite loss or gradient norm "
                    f"(step {self.step + 1}); stopping. Lower learning_rate, check rewards, or raise "
                    f"max_consecutive_skips. The last good checkpoint is in {self.run_dir / 'checkpoints'}")
        else:
            self.consecutive_skips = 0
            self.optimizer.step()
            # free the gradients now, not at the next update: the next rollout (with its packed
            # decode weights) does not hold a model-sized gradient beside it
            self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return norm

    def train_step(self) -> dict:
        cfg = self.cfg
        t0, cut_before = time.perf_counter(), self.prompts_truncated
        if cfg.ref_reset_steps and self.step and self.step % cfg.ref_reset_steps == 0:
            reset_reference(self.models.reference, self.policy)
            self.ref_reset_at = self.step
        if cfg.dynamic_sampling:  # DAPO: only groups with reward variance reach the loss
            samples, ro, rewards, metrics = dynamic_sample(self)
        else:
            samples, ro = self.sample()
            rewards, metrics = self.score(samples, ro)
        metrics.update(self.stability.knobs())  # the knob values this step trains with
        batch, adv_metrics = prepare_batch(self, ro, rewards, samples)
        metrics.update(adv_metrics)
        metrics.update(self.update(batch))
        self.step += 1
        metrics.update(generation_seconds=ro.seconds, rollout_backend=ro.backend,
                       tokens_per_second=float(ro.lengths.sum()) * self.world.size / max(ro.seconds, 1e-9),
                       step_seconds=time.perf_counter() - t0, prompts_truncated=self.prompts_truncated - cut_before)
        if cfg.consistency_steps and self.step % cfg.consistency_steps == 0:
            metrics.update(self._consistency())
        self.fuse_reason = self.stability.after_step(metrics)  # controllers move the next step's knobs
        if dist_io.all_max(int(bool(self.fuse_reason)), self.world) and not self.fuse_reason:
            self.fuse_reason = "the fuse blew on another process"  # every process stops at the same step
        if cfg.log_completions_steps and self.step % cfg.log_completions_steps == 0:
            flat = rewards.flatten().tolist()
            self.logger.log_samples(self.step, [
                {"prompt": samples[i // cfg.num_generations]["prompt"], "completion": ro.texts[i],
                 "answer": samples[i // cfg.num_generations]["answer"], "reward": flat[i]}
                for i in range(0, len(ro.texts), max(1, cfg.num_generations // 2))])
        return metrics

    def _consistency(self) -> dict:
        cfg = self.cfg
        pool = self.task.eval or self.task.train
        return consistency(self.policy, self.tok, pool[: cfg.consistency_prompts], self.rewards,
                           system_prompt=cfg.system_prompt, group_size=cfg.num_generations,
                           max_new_tokens=cfg.max_completion_length, temperature=self.stability.temperature,
                           top_p=cfg.top_p, top_k=cfg.top_k, max_prompt_length=cfg.max_prompt_length,
                           synced=self.sharded)

    # ---- the run --------------------------------------------------------------------------------
    def evaluate(self) -> dict:
        cfg = self.cfg
        # every process evaluates the same prompts (FSDP2 needs them all in each sharded forward)
        return evaluate(self.policy, self.tok, self.task.eval, self.rewards.fns[cfg.reward_names[0]], synced=self.sharded,
                        system_prompt=cfg.system_prompt, max_new_tokens=cfg.eval_max_new_tokens,
                        batch_size=cfg.eval_batch_size, pass_k=cfg.eval_pass_k,
                        pass_prompts=min(cfg.eval_pass_prompts, len(self.task.eval)), temperature=cfg.temperature,
                        top_p=cfg.top_p, top_k=cfg.top_k, max_prompt_length=cfg.max_prompt_length)

    # ---- checkpoints (grpo/resume.py) ------------------------------------------------------------
    def state(self) -> dict:
        return resume.trainer_state(self)

    def save(self) -> Path:
        """Every process gathers its part (a collective under FSDP2); rank 0 writes one checkpoint
        that resumes on any number of processes."""
        state = self.state()
        weights = None
        if self.sharded:  # tied weights (lm_head = embeddings) once, as save_pretrained writes them
            names = {n for n, _ in self.policy.named_parameters()} | {n for n, _ in self.policy.named_buffers()}
            weights = {k: v for k, v in dist_io.full_model_state(self.policy).items() if k in names}
        if self.world.is_main:
            ckpt_io.save_checkpoint(self.run_dir, self.step, self.policy, self.tok, state,
                                    keep=self.cfg.save_total_limit, weights=weights)
        dist_io.barrier(self.world)
        return self.run_dir / "checkpoints" / f"step-{self.step}"

    def _on_signal(self, signum, _frame) -> None:
        self._stop_signal = signal.Signals(signum).name

    def train(self) -> dict:
        cfg = self.cfg
        main = self.world.is_main
        self.logger = RunLogger(self.run_dir, total_steps=cfg.max_steps, start_step=self.step,
                                tensorboard=cfg.report_to == "tensorboard", progress=cfg.progress,
                                wandb_config=cfg.to_dict() if cfg.report_to == "wandb" else None,
                                ) if main else NullLogger()
        for p in ckpt_io.partial_folders(self.run_dir):
            self.logger.note(f"ignoring {p}: a checkpoint write that did not finish", "yellow")
        eval_path = self.run_dir / "eval.json"
        result: dict = {"n_prompts": len(self.task.eval)}
        if self.step and eval_path.is_file():
            result.update({k: v for k, v in json.loads(eval_path.read_text()).items() if k == "before"})
        handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            if self.task.eval and "before" not in result:
                self.logger.note(f"evaluating the untrained policy on {len(self.task.eval)} held-out prompts ...")
                result["before"] = self.evaluate()
                if main:
                    eval_path.write_text(json.dumps(result, indent=2))
                self.logger.note(f"before: accuracy {result['before']['accuracy']:.3f}")
            while self.step < cfg.max_steps and not self._should_stop():
                metrics = self.train_step()
                if self.step % cfg.logging_steps == 0 or self.step == cfg.max_steps:
                    self.logger.log_step(self.step, metrics)
                if self.fuse_reason:
                    raise FuseError(f"{self.fuse_reason} (step {self.step}); stopped, checkpoint "
                                         f"{self.save()}")
                if cfg.save_steps and self.step % cfg.save_steps == 0 and self.step < cfg.max_steps:
                    self.save()
            result["checkpoint"] = str(self.save())
            if self._stop_signal is not None:
                result["interrupted"] = self._stop_signal
                self.logger.note(f"{self._stop_signal}: saved {result['checkpoint']}; continue with "
                                 f"grpo train --resume {self.run_dir}")
            elif self.task.eval:
                result["after"] = self.evaluate()
        finally:
            for s, h in handlers.items():
                signal.signal(s, h)
            self.logger.close()
            self.rewards.close()
        if main:
            eval_path.write_text(json.dumps(result, indent=2))
        return result

    def _should_stop(self) -> bool:
        """A signal stops every process at the same step (one that stopped alone would leave the
        others waiting in a collective)."""
        flag = dist_io.all_max(int(self._stop_signal is not None), self.world)
        if flag and self._stop_signal is None:
            self._stop_signal = "SIGTERM"
        return bool(flag)
