"""The GRPO loop, top to bottom (DeepSeekMath Algorithm 1).

    every ref_reset_steps steps: reference <- policy               (iterative GRPO)
    each step: sample B prompts -> G completions each -> rewards [B, G] -> advantages
               -> mu passes of micro-batched updates of the clipped objective + beta * KL

Dimension letters: B prompts, G group size, N = B*G sequences, T completion tokens.
Only this file knows about the config, devices, the optimizer and the run folder; every formula
comes from grpo.core.
"""

from __future__ import annotations

import json
import math
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from grpo import core
from grpo import checkpoint as ckpt_io
from grpo import resume
from grpo.config import Config
from grpo.critic import Critic
from grpo.data import PromptSampler, load_task, render_prompt
from grpo.evaluate import evaluate
from grpo.logger import RunLogger
from grpo.models import keep_head_fp32, load_models, native_bf16, reset_reference
from grpo.policy import completion_logprobs
from grpo.rewards.runner import RewardRunner
from grpo.rewards.steps import process_supervision, resolve_step_reward
from grpo.rollout import Rollout, generate_rollout
from grpo.runtime import lr_lambda, make_run_dir, seed_everything


@dataclass
class Batch:
    """Everything the mu update passes need, computed once per step."""

    rollout: Rollout
    advantages: torch.Tensor  # [N, T]
    mask: torch.Tensor  # [N, T] completion tokens that count (failed rewards masked out)
    old_logp: torch.Tensor | None  # [N, T] when mu > 1, else None (ratio uses detached current logp)
    ref_logp: torch.Tensor | None  # [N, T] when beta > 0
    kl_in_loss: bool = True  # GRPO: KL is its own loss term; PPO: it is already in the reward
    values: torch.Tensor | None = None  # [N, T] critic values at sampling time (PPO)
    returns: torch.Tensor | None = None  # [N, T] GAE returns, the critic's targets (PPO)


class Trainer:
    def __init__(self, cfg: Config, *, models=None, task=None):
        self.cfg = cfg
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        seed_everything(cfg.seed)
        # Everything that can be wrong with the input is checked before the model loads.
        self.rewards = RewardRunner(cfg.reward_names, cfg.reward_weights, timeout=cfg.reward_timeout,
                                    workers=cfg.reward_workers, reward_model=cfg.reward_model)
        self.step_reward = resolve_step_reward(cfg.step_reward) if cfg.supervision == "process" else None
        self.task = task or load_task(cfg.task, eval_size=cfg.eval_prompts, max_operand=cfg.arithmetic_max_operand,
                                      ops=cfg.arithmetic_ops, prompt_field=cfg.prompt_field,
                                      answer_field=cfg.answer_field, split=cfg.task_split)
        if not self.task.train:
            raise ValueError(f"task {cfg.task!r} has no training prompts")
        self.run_dir = make_run_dir(cfg)
        cfg.save(self.run_dir / "config.yaml")
        self.models = models or load_models(cfg.model, dtype=cfg.dtype, need_reference=cfg.beta > 0,
                                            lora_r=cfg.lora_r if cfg.use_peft else 0, lora_alpha=cfg.lora_alpha,
                                            lora_dropout=cfg.lora_dropout,
                                            lora_target_modules=cfg.lora_target_modules)
        self.policy, self.tok = self.models.policy, self.models.tokenizer
        self.policy.train()
        device = next(self.policy.parameters()).device
        self.amp = cfg.bf16 if cfg.bf16 is not None else (native_bf16(device) and cfg.dtype == "float32")
        if self.amp:
            for m in (self.policy, self.models.reference):
                if m is not None:
                    keep_head_fp32(m)
        params = [p for p in self.policy.parameters() if p.requires_grad]  # LoRA: adapters only
        self.optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2),
                                           weight_decay=cfg.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg))
        self.critic = None
        if cfg.advantage_estimator == "gae":  # the PPO baseline: a learned value model
            self.critic = Critic(self.models.path, dtype=getattr(torch, cfg.dtype),
                                 learning_rate=cfg.critic_learning_rate, clip_range=cfg.cliprange_value,
                                 max_grad_norm=cfg.max_grad_norm, divergence_factor=cfg.critic_divergence_factor,
                                 autocast=self.amp, vf_coef=cfg.vf_coef,
                                 shared_policy=self.policy if cfg.critic_shared_trunk else None)
        self.sampler = PromptSampler(len(self.task.train), seed=cfg.seed)
        self.step = 0
        self.skipped_updates = 0
        self.consecutive_skips = 0
        self.reward_failures = 0
        self.ref_reset_at = 0  # step at which the reference last became a copy of the policy
        self._stop_signal: str | None = None
        # helpers whose state the next step depends on (controllers, filters): name -> object with
        # state_dict()/load_state_dict(); saved in and restored from every checkpoint
        self.stateful: dict = {}
        path = resume.resume_path(cfg.resume_from_checkpoint, self.run_dir)
        if path is not None:
            resume.restore(self, path)

    # ---- one step -------------------------------------------------------------------------------
    def sample(self) -> tuple[list[dict], Rollout]:
        cfg = self.cfg
        samples = [self.task.train[i] for i in self.sampler.next(cfg.prompts_per_step)]
        prompts = [render_prompt(self.tok, s["prompt"], cfg.system_prompt) for s in samples]
        ro = generate_rollout(self.policy, self.tok, prompts, group_size=cfg.num_generations,
                              max_new_tokens=cfg.max_completion_length, temperature=cfg.temperature,
                              top_p=cfg.top_p, top_k=cfg.top_k, max_prompt_length=cfg.max_prompt_length,
                              with_logprobs=False)  # the loss recomputes them; keeping [N, T, V] logits costs memory
        return samples, ro

    def score(self, samples: list[dict], ro: Rollout) -> tuple[torch.Tensor, dict]:
        """Rewards [B, G] (NaN where a reward failed) and the reward metrics."""
        cfg = self.cfg
        group_samples = [s for s in samples for _ in range(cfg.num_generations)]
        res = self.rewards.score(ro.texts, group_samples)
        for msg in res.messages:
            self.logger.note(f"[yellow]{msg}")
        n_failed = int(res.failed.sum())
        self.reward_failures += n_failed
        first = res.per_reward[cfg.reward_names[0]]
        metrics = {f"rewards/{k}": float(torch.nanmean(v)) for k, v in res.per_reward.items()}
        metrics.update(accuracy=float((first >= 1.0).double().mean()), reward_failures=n_failed,
                       reward_failures_total=self.reward_failures, reward_timeouts_total=self.rewards.timeouts)
        return res.total.float().view(cfg.prompts_per_step, cfg.num_generations), metrics

    def prepare(self, ro: Rollout, rewards: torch.Tensor, samples: list[dict] | None = None) -> tuple[Batch, dict]:
        cfg = self.cfg
        failed = torch.isnan(rewards)  # [B, G]
        # A failed reward neither rewards nor punishes: it takes its group's mean and leaves the loss.
        group_mean = torch.nan_to_num(torch.nanmean(rewards, dim=1, keepdim=True), nan=0.0)  # [B, 1]
        filled = torch.where(failed, group_mean.expand_as(rewards), rewards)  # [B, G]
        mask = ro.completion_mask * (~failed).reshape(-1, 1)  # [N, T]
        old_logp = self._logps(self.policy, ro) if cfg.num_iterations > 1 else None
        ref_logp = self._ref_logps(ro) if cfg.beta > 0 else None
        metrics = {"reward_mean": float(torch.nanmean(rewards)),
                   "reward_std": float(rewards[~failed].std(correction=0)) if (~failed).sum() > 1 else 0.0,
                   "zero_variance_share": float(core.zero_variance_share(filled))}
        if cfg.supervision == "process":  # DeepSeekMath 4.1.3: per-step rewards, token advantages
            adv_tok, mask, step_metrics = process_supervision(
                self.step_reward, self.tok, ro, samples, mask, group_size=cfg.num_generations,
                std_eps=cfg.std_eps, unbiased_std=cfg.scale_rewards_unbiased)  # [N, T]
            metrics.update(step_metrics)
            return Batch(ro, adv_tok, mask, old_logp, ref_logp), metrics
        if self.critic is None:
            adv = core.compute_advantages(filled, estimator=cfg.advantage_estimator, std_eps=cfg.std_eps,
                                          unbiased_std=cfg.scale_rewards_unbiased)  # [B, G]
            adv_tok = adv.reshape(-1, 1).expand_as(mask).contiguous()  # [N, T]
            metrics["advantage_variance"] = float(core.advantage_group_variance(adv))
            return Batch(ro, adv_tok, mask, old_logp, ref_logp), metrics
        # PPO (DeepSeekMath eq. 2): KL penalty in the per-token reward, GAE on critic values, whitened.
        values = self.critic.values(ro, cfg.per_device_train_batch_size)  # [N, T]
        # the KL in the reward compares pi_old and pi_ref computed the same way (same kernels, same
        # precision), so it is exactly 0 while the policy still equals the reference
        if ref_logp is None:
            behaviour = torch.zeros_like(values)  # no KL term: the score alone, on the last token
        else:
            behaviour = old_logp if old_logp is not None else self._logps(self.policy, ro)  # [N, T]
        rewards_tok = core.kl_shaped_rewards(filled.flatten(), behaviour, ref_logp, mask, kl_coef=cfg.beta)
        est = core.gae(rewards_tok, values, mask, gamma=cfg.gamma, lam=cfg.lam)
        adv_tok = core.whiten(est["advantages"], mask)  # [N, T]
        seq_adv = core.masked_mean(adv_tok, mask, dim=1).view_as(filled)  # [B, G]
        metrics.update(advantage_variance=float(core.advantage_group_variance(seq_adv)),
                       value_mean=float(core.masked_mean(values, mask)),
                       explained_variance=float(core.explained_variance(values, est["returns"], mask)))
        return Batch(ro, adv_tok, mask, old_logp, ref_logp, kl_in_loss=False, values=values,
                     returns=est["returns"]), metrics

    @torch.no_grad()
    def _logps(self, model, ro: Rollout) -> torch.Tensor:
        mb = self.cfg.per_device_train_batch_size
        parts = []
        for idx in torch.arange(ro.completion_ids.shape[0]).split(mb):
            parts.append(completion_logprobs(model, ro.prompt_ids[idx], ro.prompt_mask[idx],
                                             ro.completion_ids[idx], ro.completion_mask[idx],
                                             temperature=self.cfg.temperature, autocast=self.amp)["logp"])
        return torch.cat(parts)  # [N, T]

    def _ref_logps(self, ro: Rollout) -> torch.Tensor:
        if self.models.reference is not None:
            return self._logps(self.models.reference, ro)
        with self.policy.disable_adapter():  # LoRA: the base model is the reference
            return self._logps(self.policy, ro)

    def update(self, batch: Batch) -> dict:
        """mu passes; each pass accumulates micro-batch gradients and takes one optimizer step."""
        cfg, ro = self.cfg, batch.rollout
        n = ro.completion_ids.shape[0]
        total = batch.mask.sum() if cfg.aggregation == "token_mean" else n
        sums: dict[str, float] = {}
        tokens_seen = 0.0
        grad_norms = []
        for _ in range(cfg.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            for idx in torch.arange(n).split(cfg.per_device_train_batch_size):
                cur = completion_logprobs(self.policy, ro.prompt_ids[idx], ro.prompt_mask[idx],
                                          ro.completion_ids[idx], ro.completion_mask[idx],
                                          temperature=cfg.temperature, with_entropy=cfg.entropy_coef > 0,
                                          autocast=self.amp)
                logp = cur["logp"]  # [n, T]
                old = batch.old_logp[idx] if batch.old_logp is not None else logp.detach()
                out = core.policy_loss(
                    logp, old, batch.advantages[idx], batch.mask[idx],
                    ref_logp=batch.ref_logp[idx] if batch.ref_logp is not None else None,
                    eps_low=cfg.epsilon, eps_high=cfg.eps_high, dual_clip=cfg.dual_clip,
                    ratio_level=cfg.importance_sampling_level, kl_coef=cfg.beta if batch.kl_in_loss else 0.0,
                    kl_estimator=cfg.kl_estimator,
                    aggregation=cfg.aggregation, norm_length=cfg.max_completion_length, total=total,
                    entropy=cur["entropy"], entropy_coef=cfg.entropy_coef)
                out["loss"].backward()
                w = float(batch.mask[idx].sum())  # token weight of this micro-batch's means
                tokens_seen += w
                for k in ("kl", "entropy", "ratio_mean", "clip_fraction", "clip_fraction_low", "clip_fraction_high"):
                    sums[k] = sums.get(k, 0.0) + float(out[k]) * w
                sums["loss"] = sums.get("loss", 0.0) + float(out["loss"].detach()) / cfg.num_iterations
                sums["policy_loss"] = sums.get("policy_loss", 0.0) + float(out["policy_loss"]) / cfg.num_iterations
            if self.critic is not None:  # PPO epochs train the critic on the same batch; with a shared
                # trunk its value-loss gradients join the policy's before the policy steps
                critic_metrics = self.critic.update(ro, batch.values, batch.returns, batch.mask,
                                                    micro_batch=cfg.per_device_train_batch_size)
            grad_norms.append(self._optimizer_step())
        metrics = {k: v / max(tokens_seen, 1.0) for k, v in sums.items() if k not in ("loss", "policy_loss")}
        metrics.update(loss=sums["loss"], policy_loss=sums["policy_loss"], grad_norm=grad_norms[-1],
                       skipped_updates=self.skipped_updates, learning_rate=self.scheduler.get_last_lr()[0])
        if self.critic is not None:
            metrics.update(critic_metrics)
        return metrics

    def _optimizer_step(self) -> float:
        params = [p for p in self.policy.parameters() if p.grad is not None]
        max_norm = self.cfg.max_grad_norm if self.cfg.max_grad_norm > 0 else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
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
        self.scheduler.step()
        return norm

    def train_step(self) -> dict:
        cfg = self.cfg
        t0 = time.perf_counter()
        if cfg.ref_reset_steps and self.step and self.step % cfg.ref_reset_steps == 0:
            reset_reference(self.models.reference, self.policy)
            self.ref_reset_at = self.step
        samples, ro = self.sample()
        rewards, metrics = self.score(samples, ro)
        batch, adv_metrics = self.prepare(ro, rewards, samples)
        metrics.update(adv_metrics)
        metrics.update(self.update(batch))
        self.step += 1
        lengths = ro.lengths.float()
        metrics.update(completion_length_mean=float(lengths.mean()), completion_length_max=float(lengths.max()),
                       truncated_share=float(ro.truncated.float().mean()), generation_seconds=ro.seconds,
                       tokens_per_second=float(lengths.sum()) / max(ro.seconds, 1e-9), rollout_backend=ro.backend,
                       step_seconds=time.perf_counter() - t0)
        if cfg.log_completions_steps and self.step % cfg.log_completions_steps == 0:
            flat = rewards.flatten().tolist()
            self.logger.log_samples(self.step, [
                {"prompt": samples[i // cfg.num_generations]["prompt"], "completion": ro.texts[i],
                 "answer": samples[i // cfg.num_generations]["answer"], "reward": flat[i]}
                for i in range(0, len(ro.texts), max(1, cfg.num_generations // 2))])
        return metrics

    # ---- the run --------------------------------------------------------------------------------
    def evaluate(self) -> dict:
        cfg = self.cfg
        return evaluate(self.policy, self.tok, self.task.eval, self.rewards.fns[cfg.reward_names[0]],
                        system_prompt=cfg.system_prompt, max_new_tokens=cfg.eval_max_new_tokens,
                        batch_size=cfg.eval_batch_size, pass_k=cfg.eval_pass_k,
                        pass_prompts=min(cfg.eval_pass_prompts, len(self.task.eval)), temperature=cfg.temperature,
                        top_p=cfg.top_p, top_k=cfg.top_k, max_prompt_length=cfg.max_prompt_length)

    # ---- checkpoints (grpo/resume.py) ------------------------------------------------------------
    def state(self) -> dict:
        return resume.trainer_state(self)

    def save(self) -> Path:
        return ckpt_io.save_checkpoint(self.run_dir, self.step, self.policy, self.tok, self.state(),
                                       keep=self.cfg.save_total_limit)

    def _on_signal(self, signum, _frame) -> None:
        self._stop_signal = signal.Signals(signum).name

    def train(self) -> dict:
        cfg = self.cfg
        self.logger = RunLogger(self.run_dir, total_steps=cfg.max_steps, start_step=self.step,
                                tensorboard=cfg.report_to == "tensorboard", progress=cfg.progress)
        for p in ckpt_io.partial_folders(self.run_dir):
            self.logger.note(f"[yellow]ignoring {p}: a checkpoint write that did not finish")
        eval_path = self.run_dir / "eval.json"
        result: dict = {"n_prompts": len(self.task.eval)}
        if self.step and eval_path.is_file():
            result.update({k: v for k, v in json.loads(eval_path.read_text()).items() if k == "before"})
        handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            if self.task.eval and "before" not in result:
                self.logger.note(f"evaluating the untrained policy on {len(self.task.eval)} held-out prompts ...")
                result["before"] = self.evaluate()
                eval_path.write_text(json.dumps(result, indent=2))
                self.logger.note(f"before: accuracy {result['before']['accuracy']:.3f}")
            while self.step < cfg.max_steps and self._stop_signal is None:
                metrics = self.train_step()
                if self.step % cfg.logging_steps == 0 or self.step == cfg.max_steps:
                    self.logger.log_step(self.step, metrics)
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
        eval_path.write_text(json.dumps(result, indent=2))
        return result
