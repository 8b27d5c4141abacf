"""A step's batch: from this process's rollout and the step's rewards [B, G] to everything the mu
update epochs need (advantages, the mask of counted tokens, old-policy and reference log-probs, the
critic's values and returns for PPO), computed once per step.

Dimension letters: B prompts, G group size, N = B*G sequences (n on this process), T completion tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo import core
from grpo.infra import distributed as dist_io
from grpo.infra.timing import NullTimer, StageTimer
from grpo.rewards.steps import process_supervision
from grpo.rollout import Rollout


@dataclass
class Batch:
    """Everything the mu update epochs need, computed once per step."""

    rollout: Rollout
    advantages: torch.Tensor  # [N, T]
    mask: torch.Tensor  # [N, T] loss tokens that count (rollout.loss_mask, failed and filtered rows out)
    old_logp: torch.Tensor | None  # [N, T] when mu > 1 or mini_batches > 1, else None (ratio uses detached current logp)
    ref_logp: torch.Tensor | None  # [N, T] when beta > 0
    kl_in_loss: bool = True  # GRPO: KL is its own loss term; PPO: it is already in the reward
    values: torch.Tensor | None = None  # [N, T] critic values at sampling time (PPO)
    returns: torch.Tensor | None = None  # [N, T] GAE returns, the critic's targets (PPO)


class BatchMaker:
    """Makes a step's Batch: the models it runs (policy, reference, critic) and how it runs them
    (``forwards``) are fixed for the run; the knobs (temperature, beta) are given per step."""

    def __init__(self, cfg, *, world: dist_io.World, forwards, policy, reference, critic, step_reward, tokenizer,
                 timer: StageTimer | None = None):
        self.cfg, self.world, self.forwards = cfg, world, forwards
        self.timer = timer or NullTimer()  # seconds of the old-policy and reference forwards
        self.policy, self.reference, self.critic = policy, reference, critic
        self.step_reward, self.tok = step_reward, tokenizer

    def frozen_logps(self, model, ro: Rollout, temperature: float) -> torch.Tensor:
        """Log-probs [N, T] of the rollout under ``model`` (old policy or reference), no gradient."""
        return self.forwards.frozen_logps(model, ro, temperature=temperature,
                                          micro_batch=self.cfg.per_device_train_batch_size)

    def reference_logps(self, ro: Rollout, temperature: float) -> torch.Tensor:
        with self.timer.stage("reference"):
            if self.reference is not None:
                return self.frozen_logps(self.reference, ro, temperature)
            with self.policy.disable_adapter():  # LoRA: the base model is the reference
                return self.frozen_logps(self.policy, ro, temperature)

    def old_logps(self, ro: Rollout, temperature: float) -> torch.Tensor:
        with self.timer.stage("old_logp"):
            return self.frozen_logps(self.policy, ro, temperature)

    def make(self, ro: Rollout, rewards: torch.Tensor, samples: list[dict] | None, *, temperature: float,
             beta: float) -> tuple[Batch, dict]:
        """This process's batch from its rollout and the step's global rewards [B, G]: advantages
        are computed on all B groups (identically on every process), then each keeps its rows.
        ``samples`` (this process's prompts) are needed by process supervision's step rewards."""
        cfg, world = self.cfg, self.world
        rewards = rewards.to(ro.completion_mask.device)  # [B, G] scored on the CPU
        rows = slice(world.rank * ro.completion_ids.shape[0], (world.rank + 1) * ro.completion_ids.shape[0])
        lengths = dist_io.gather_rows(ro.lengths, world)  # [N_global]
        truncated = dist_io.gather_rows(ro.truncated, world)  # [N_global]
        # overlong penalty, PF-PPO: on the whole step's groups, from every process's lengths
        rewards, keep, filter_metrics = reshape_rewards(rewards, lengths=lengths, truncated=truncated, cfg=cfg)
        failed = torch.isnan(rewards)  # [B, G]
        # A failed reward neither rewards nor punishes: it takes its group's mean and leaves the loss.
        group_mean = torch.nan_to_num(torch.nanmean(rewards, dim=1, keepdim=True), nan=0.0)  # [B, 1]
        filled = torch.where(failed, group_mean.expand_as(rewards), rewards)  # [B, G]
        mask = ro.loss_mask * (~failed & keep).reshape(-1, 1)[rows]  # [n, T] trained tokens that count
        # the sampling policy's log-probs, once the policy can have moved: after the first epoch or mini-batch
        old_logp = self.old_logps(ro, temperature) \
            if cfg.num_iterations > 1 or cfg.mini_batches > 1 else None
        ref_logp = self.reference_logps(ro, temperature) if cfg.beta > 0 else None
        metrics = {"reward_mean": float(torch.nanmean(rewards)),
                   "reward_std": float(rewards[~failed].std(correction=0)) if (~failed).sum() > 1 else 0.0,
                   "zero_variance_share": float(core.zero_variance_share(filled)), **filter_metrics,
                   "completion_length_mean": float(lengths.float().mean()),
                   "completion_length_max": float(lengths.max()), "truncated_share": float(truncated.float().mean())}
        if cfg.supervision == "process":  # DeepSeekMath 4.1.3: per-step rewards, token advantages
            adv_tok, mask, step_metrics = process_supervision(
                self.step_reward, self.tok, ro, samples, mask, group_size=cfg.num_generations,
                std_eps=cfg.std_eps, unbiased_std=cfg.scale_rewards_unbiased)  # [N, T]
            metrics.update(step_metrics)
            return Batch(ro, adv_tok, mask, old_logp, ref_logp), metrics
        if self.critic is None:
            adv = core.compute_advantages(filled, estimator=cfg.advantage_estimator, std_eps=cfg.std_eps,
                                          unbiased_std=cfg.scale_rewards_unbiased)  # [B, G]
            adv_tok = adv.reshape(-1, 1)[rows].expand_as(mask).contiguous()  # [n, T]
            metrics["advantage_variance"] = float(core.advantage_group_variance(adv))
            return Batch(ro, adv_tok, mask, old_logp, ref_logp), metrics
        return self._ppo(ro, filled.flatten()[rows], filled.shape, mask, old_logp, ref_logp, metrics,
                         temperature=temperature, beta=beta)

    def _ppo(self, ro, scores, shape, mask, old_logp, ref_logp, metrics, *, temperature: float,
             beta: float) -> tuple[Batch, dict]:
        """PPO (DeepSeekMath eq. 2): KL penalty in the per-token reward, GAE on critic values, whitened.
        The KL in the reward compares pi_old and pi_ref computed the same way (same kernels, same
        precision), so it is exactly 0 while the policy still equals the reference."""
        cfg = self.cfg
        behaviour = None if ref_logp is None else old_logp if old_logp is not None else \
            self.frozen_logps(self.policy, ro, temperature)
        est = self.critic.advantages(ro, scores, behaviour, ref_logp, mask, kl_coef=beta, gamma=cfg.gamma,
                                     lam=cfg.lam, micro_batch=cfg.per_device_train_batch_size)  # this process's rows
        seq_adv = dist_io.gather_rows(core.masked_mean(est["advantages"], mask, dim=1), self.world).view(shape)  # [B, G]
        metrics.update(advantage_variance=float(core.advantage_group_variance(seq_adv)), **est["metrics"])
        return Batch(ro, est["advantages"], mask, old_logp, ref_logp, kl_in_loss=False, values=est["values"],
                     returns=est["returns"]), metrics


def reshape_rewards(rewards: torch.Tensor, *, lengths: torch.Tensor, truncated: torch.Tensor,
                    cfg) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Apply the reward-side tools before advantages: the overlong penalty (added to the reward) and
    the PF-PPO filter. rewards: [B, G], lengths and truncated: [B * G] ->
    (rewards [B, G], keep [B, G] bool, metrics)."""
    metrics: dict = {}
    if cfg.overlong_buffer:  # DAPO soft overlong punishment (arXiv 2503.14476, eq. 13)
        pen = core.overlong_penalty(lengths, max_length=cfg.max_completion_length,
                                    buffer=cfg.overlong_buffer).view_as(rewards)  # [B, G]
        rewards = rewards + cfg.overlong_penalty_coef * pen
        metrics["overlong_penalty_mean"] = float(pen.mean())
    keep = torch.ones_like(rewards, dtype=torch.bool)  # [B, G]
    if cfg.overlong_filter:  # DAPO overlong filtering: truncated completions leave the loss
        keep &= ~truncated.view_as(rewards)
    if cfg.policy_filter:  # PF-PPO (arXiv 2409.06957)
        keep &= core.policy_filter(rewards, mode=cfg.policy_filter, min_std=cfg.policy_filter_min_std)
        metrics["policy_filter_kept_share"] = float(keep.float().mean())
    return rewards, keep, metrics
