"""A step's batch: from this process's rollout and the step's rewards [B, G] to everything the mu
update epochs need (advantages, the mask of counted tokens, old-policy and reference log-probs, the
critic's values and returns for PPO), computed once per step.

Dimension letters: B prompts, G group size, N = B*G sequences (n on this process), T completion tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

from grpo import core
from grpo.infra import distributed
from grpo.infra.timing import NullTimer, StageTimer
from grpo.rewards.steps import process_supervision
from grpo.rollout import Rollout, engine_class
from grpo.train.code_tokens import code_token_vocab
from grpo.train.compiled import loss_and_advantage_functions


@dataclass(frozen=True)
class Batch:
    """Everything the mu update epochs need, computed once per step (``BatchMaker.make``)."""

    rollout: Rollout
    advantages: torch.Tensor  # [N, T]
    mask: torch.Tensor  # [N, T] loss tokens that count (rollout.loss_mask, failed and filtered rows out)
    old_logp: torch.Tensor | None  # [N, T] when mu > 1 or mini_batches > 1, else None (ratio uses detached current logp)
    ref_logp: torch.Tensor | None  # [N, T] when beta > 0
    kl_in_loss: bool = True  # GRPO: KL is its own loss term; PPO: it is already in the reward
    values: torch.Tensor | None = None  # [N, T] critic values at sampling time (PPO)
    returns: torch.Tensor | None = None  # [N, T] GAE returns, the critic's targets (PPO)
    # importance weights that read the trainer's log-probs, left to the update's own forward (LogpWeight)
    deferred: tuple["LogpWeight", ...] = ()
    weights: torch.Tensor | None = None  # [N, T] the importance weights applied to the advantages (None: none)
    # [N, T] log q of the old policy (grpo.core.sampling) where the run's q is not pi_T and a correction weighs
    old_qlogp: torch.Tensor | None = None

    @property
    def correction_logp(self) -> torch.Tensor | None:
        """The trainer's log-probs an importance correction compares with the engine's: log q (the sampling
        distribution, as the engine reports) where it differs from pi_T, else the old policy's."""
        return self.old_qlogp if self.old_qlogp is not None else self.old_logp


@dataclass(frozen=True)
class LogpWeight:
    """An importance weight of the advantages that reads the trainer's log-probs of the rollout
    (pi_train / pi_engine: the engine mismatch correction, or the stale-token correction of
    asynchronous rollouts). ``weigh(train_logp [n, T], rows [n])`` gives the weights [n, T] and the
    metrics of those rows; every weight is per row (a token's, or its row's), so rows weighed apart
    weigh as they do together. ``prefix`` goes before the metrics' names.

    Where the old policy's log-probs are computed anyway (mu > 1 or several mini-batches) the weight
    is applied when the batch is made; else the update weighs each micro-batch by its own forward's
    detached log-probs, which are the same policy's (the weights move only at the mini-batch's
    optimizer step), and saves the inference forward over the whole batch."""

    prefix: str
    weigh: Callable[[torch.Tensor, torch.Tensor], core.Correction]


def apply_logp_weight(batch: Batch, weight: LogpWeight, train_logp: torch.Tensor | None) -> tuple[Batch, dict]:
    """The batch with ``weight`` applied now, from ``train_logp`` [n, T] (the trainer's log-probs of
    all its rows), or deferred to the update when there are none (``train_logp`` None); the metrics
    of the weight applied now (deferred ones report theirs after the update)."""
    if train_logp is None:
        return replace(batch, deferred=batch.deferred + (weight,)), {}
    corr = weight.weigh(train_logp, torch.arange(train_logp.shape[0]))
    metrics = {weight.prefix + k: float(v) for k, v in corr.metrics.items()}
    metrics[weight.prefix + "rollout_is_sequences"] = float(train_logp.shape[0])
    weights = corr.weights if batch.weights is None else batch.weights * corr.weights  # [n, T]; w >= 0
    return replace(batch, advantages=batch.advantages * corr.weights, weights=weights), metrics


@dataclass(frozen=True)
class RewardShaping:
    """The reward-side tools applied before advantages (``reshape_rewards``); the Config fields of the
    same names."""

    overlong_buffer: int  # DAPO's soft overlong punishment ramps over this many tokens (0: off)
    overlong_penalty_coef: float  # its weight in the reward
    max_completion_length: int  # where the ramp ends
    overlong_filter: bool  # DAPO: truncated completions leave the loss
    policy_filter: str | None  # PF-PPO's mode (None: off)
    policy_filter_min_std: float  # PF-PPO variance mode's threshold


@dataclass(frozen=True)
class BatchSettings:
    """What a step's batch is made with; each field is the Config field named in its comment."""

    group_size: int  # num_generations (G)
    old_logp: bool  # num_iterations > 1 or mini_batches > 1: the sampling policy's log-probs are computed
    reference: bool  # beta > 0 or a teacher (distillation): the reference's log-probs are computed
    micro_batch: int  # per_device_train_batch_size: sequences per inference forward
    shaping: RewardShaping  # overlong penalty and filter, PF-PPO
    process_supervision: bool  # supervision == "process" (per-step rewards: step_reward)
    advantage_estimator: str  # advantage_estimator (gae: PPO's critic)
    std_eps: float  # std_eps
    unbiased_std: bool  # scale_rewards_unbiased
    multi_objective_aggregation: str  # multi_objective_aggregation (normalize_then_sum: GDPO)
    reward_weights: tuple[float, ...] | None  # reward_weights (None: all 1)
    gamma: float  # gamma: GAE's discount (PPO)
    lam: float  # lam: GAE's lambda (PPO)
    correct_threshold: float  # correct_threshold: a reward at least this is correct (seed monitors)
    token_weight_gamma: float  # token_weight_gamma: identifier and operator tokens' advantage factor
    correction: str  # rollout_correction, auto resolved for the run's engine (correction_mode)
    correction_level: str  # rollout_correction_level
    correction_low: float | None  # rollout_correction_low
    correction_high: float | None  # rollout_correction_high
    torch_compile: bool = False  # torch_compile: the advantages computed by torch.compile (train/compiled.py)


class BatchMaker:
    """Makes a step's Batch: the models it runs (policy, reference, critic) and how it runs them
    (``forwards``) are fixed for the run; the knobs (temperature, beta) are given per step.
    ``consistency``: the logic-consistency regulariser (grpo.train.logic_consistency.LogicConsistency), or None."""

    def __init__(self, settings: BatchSettings, *, world: distributed.World, forwards, policy, reference, critic,
                 step_reward, tokenizer, timer: StageTimer | None = None, consistency=None):
        self.settings, self.world, self.forwards = settings, world, forwards
        self.timer = timer or NullTimer()  # seconds of the old-policy and reference forwards
        self.policy, self.reference, self.critic = policy, reference, critic
        self.step_reward, self.tok = step_reward, tokenizer
        self._code_vocab: torch.Tensor | None = None  # [V] identifier/operator tokens (token_weight_gamma)
        self.consistency = consistency
        _, self._advantages_fn = loss_and_advantage_functions(settings.torch_compile)  # core.compute_advantages

    def frozen_logps(self, model, ro: Rollout, temperature: float) -> torch.Tensor:
        """Log-probs [N, T] of the rollout under ``model`` (old policy or reference), no gradient."""
        return self.forwards.frozen_logps(model, ro, temperature=temperature,
                                          micro_batch=self.settings.micro_batch)

    def reference_logps(self, ro: Rollout, temperature: float) -> torch.Tensor:
        with self.timer.stage("reference"):
            if self.reference is not None:
                return self.frozen_logps(self.reference, ro, temperature)
            with self.policy.disable_adapter():  # LoRA: the base model is the reference
                return self.frozen_logps(self.policy, ro, temperature)

    def old_logps(self, ro: Rollout, temperature: float) -> dict:
        """{"logp": [N, T]} of the old policy, and "qlogp" where the corrections compare log q."""
        with self.timer.stage("old_logp"):
            return self.forwards.frozen(self.policy, ro, temperature=temperature,
                                        micro_batch=self.settings.micro_batch, with_q=True)

    def make(self, ro: Rollout, rewards: torch.Tensor, samples: list[dict] | None, *, temperature: float,
             beta: float, per_reward: torch.Tensor | None = None) -> tuple[Batch, dict]:
        """This process's batch (``build``); with token_weight_gamma != 1 the advantages of identifier
        and operator tokens are multiplied by it (seed 003 section 5.1), and they are weighted by the
        train/inference mismatch correction where one is configured (``correction_mode``). With the
        logic-consistency regulariser, each completion's advantage A_cons (core/logic_consistency.py) is
        added to its tokens' advantages first. Where the correction needs the trainer's log-probs and
        the batch has none (one optimizer step per batch), it is left in ``Batch.deferred`` and the
        update applies it in its own forward: the advantages returned are then not yet weighted."""
        s = self.settings
        batch, metrics = self.build(ro, rewards, samples, temperature=temperature, beta=beta,
                                    per_reward=per_reward)
        if self.consistency is not None:  # a score-function advantage per completion (core/logic_consistency.py)
            adv_cons, cons_metrics = self.consistency.advantages(ro.texts)  # [n]
            batch = replace(batch, advantages=batch.advantages + adv_cons.to(batch.advantages)[:, None])  # [n, T]
            metrics.update(cons_metrics)
        if s.token_weight_gamma != 1.0:
            if self._code_vocab is None:
                self._code_vocab = code_token_vocab(self.tok, len(self.tok))
            vocab = self._code_vocab.to(ro.completion_ids.device)  # [V]
            batch = replace(batch, advantages=core.weighted_advantages(batch.advantages, ro.completion_ids, vocab,
                                                                       gamma=s.token_weight_gamma))  # [n, T]
            marked = core.token_weights(ro.completion_ids, vocab, gamma=2.0) > 1  # [n, T]
            metrics["weighted_token_share"] = float(core.masked_mean(marked.float(), batch.mask))
        if s.correction != "none":  # w >= 0 scales the surrogate term only
            batch, corr_metrics = apply_logp_weight(batch, self.correction(batch), batch.correction_logp)
            metrics.update(corr_metrics)
        return batch, metrics

    def correction(self, batch: Batch) -> LogpWeight:
        """Each token's weight pi_train / pi_engine (core.correction_weights, ``correction`` mode): the
        trainer's log-probs of the rollout against the engine's sampling log-probs."""
        s, ro = self.settings, batch.rollout
        if ro.sampling_logp is None:
            raise ValueError(f"rollout_correction={s.correction}: the {ro.engine!r} rollout carries no "
                             "sampling log-probs")
        engine, mask = ro.sampling_logp, batch.mask  # [n, T] each

        def weigh(train_logp: torch.Tensor, rows: torch.Tensor) -> core.Correction:
            return core.correction_weights(train_logp, engine[rows].to(train_logp.dtype), mask[rows],
                                           level=s.correction_level, mode=s.correction,
                                           low=s.correction_low, high=s.correction_high)
        return LogpWeight(prefix="", weigh=weigh)

    def build(self, ro: Rollout, rewards: torch.Tensor, samples: list[dict] | None, *, temperature: float,
              beta: float, per_reward: torch.Tensor | None = None) -> tuple[Batch, dict]:
        """This process's batch from its rollout and the step's global rewards [B, G]: advantages
        are computed on all B groups (identically on every process), then each keeps its rows.
        ``samples`` (this process's prompts) are needed by process supervision's step rewards;
        ``per_reward`` [B, G, K] (each reward function's raw scores) by normalize_then_sum (GDPO)."""
        s, world = self.settings, self.world
        rewards = rewards.to(ro.completion_mask.device)  # [B, G] scored on the CPU
        rows = slice(world.rank * ro.completion_ids.shape[0], (world.rank + 1) * ro.completion_ids.shape[0])
        lengths = distributed.gather_rows(ro.lengths, world)  # [N_global]
        truncated = distributed.gather_rows(ro.truncated, world)  # [N_global]
        # overlong penalty, PF-PPO: on the whole step's groups, from every process's lengths
        rewards, keep, filter_metrics = reshape_rewards(rewards, lengths=lengths, truncated=truncated,
                                                        shaping=s.shaping)
        failed = torch.isnan(rewards)  # [B, G]
        # A failed reward neither rewards nor punishes: it takes its group's mean and leaves the loss.
        group_mean = torch.nan_to_num(torch.nanmean(rewards, dim=1, keepdim=True), nan=0.0)  # [B, 1]
        filled = torch.where(failed, group_mean.expand_as(rewards), rewards)  # [B, G]
        mask = ro.loss_mask * (~failed & keep).reshape(-1, 1)[rows]  # [n, T] trained tokens that count
        # the sampling policy's log-probs, once the policy can have moved: after the first epoch or mini-batch
        old = self.old_logps(ro, temperature) if s.old_logp else {}
        old_logp, old_q = old.get("logp"), old.get("qlogp")
        ref_logp = self.reference_logps(ro, temperature) if s.reference else None
        metrics = {"reward_mean": float(torch.nanmean(rewards)),
                   "reward_std": float(rewards[~failed].std(correction=0)) if (~failed).sum() > 1 else 0.0,
                   "zero_variance_share": float(core.zero_variance_share(filled)), **filter_metrics,
                   "completion_length_mean": float(lengths.float().mean()),
                   "completion_length_max": float(lengths.max()), "truncated_share": float(truncated.float().mean())}
        metrics.update(seed_metrics(filled, ro, correct_at=s.correct_threshold))
        if s.process_supervision:  # DeepSeekMath 4.1.3: per-step rewards, token advantages
            adv_tok, mask, step_metrics = process_supervision(
                self.step_reward, self.tok, ro, samples, mask, group_size=s.group_size,
                std_eps=s.std_eps, unbiased_std=s.unbiased_std)  # [N, T]
            metrics.update(step_metrics)
            return Batch(ro, adv_tok, mask, old_logp, ref_logp, old_qlogp=old_q), metrics
        if self.critic is None:
            adv = self._advantages(filled, failed, per_reward)  # [B, G]
            adv_tok = adv.reshape(-1, 1)[rows].expand_as(mask).contiguous()  # [n, T]
            metrics["advantage_variance"] = float(core.advantage_group_variance(adv))
            if s.multi_objective_aggregation == "normalize_then_sum":  # GDPO scales the batch to std 1
                metrics["advantage_batch_std"] = float(adv.std(correction=1 if adv.numel() > 1 else 0))
            return Batch(ro, adv_tok, mask, old_logp, ref_logp, old_qlogp=old_q), metrics
        batch, metrics = self._ppo(ro, filled.flatten()[rows], filled.shape, mask, old_logp, ref_logp, metrics,
                                   temperature=temperature, beta=beta)
        return replace(batch, old_qlogp=old_q), metrics

    def _ppo(self, ro, scores, shape, mask, old_logp, ref_logp, metrics, *, temperature: float,
             beta: float) -> tuple[Batch, dict]:
        """PPO (DeepSeekMath eq. 2): KL penalty in the per-token reward, GAE on critic values, whitened.
        The KL in the reward compares pi_old and pi_ref computed the same way (same kernels, same
        precision), so it is exactly 0 while the policy still equals the reference."""
        s = self.settings
        behaviour = None if ref_logp is None else old_logp if old_logp is not None else \
            self.frozen_logps(self.policy, ro, temperature)
        est = self.critic.advantages(ro, scores, behaviour, ref_logp, mask, kl_coef=beta, gamma=s.gamma,
                                     lam=s.lam, micro_batch=s.micro_batch)  # this process's rows
        seq_adv = distributed.gather_rows(core.masked_mean(est["advantages"], mask, dim=1), self.world).view(shape)  # [B, G]
        metrics.update(advantage_variance=float(core.advantage_group_variance(seq_adv)), **est["metrics"])
        return Batch(ro, est["advantages"], mask, old_logp, ref_logp, kl_in_loss=False, values=est["values"],
                     returns=est["returns"]), metrics

    def _advantages(self, filled: torch.Tensor, failed: torch.Tensor, per_reward: torch.Tensor | None) -> torch.Tensor:
        """Advantages [B, G] of outcome supervision from the step's rewards (filled: [B, G], failed ones
        at their group's mean) or, with normalize_then_sum, from each reward function's scores (GDPO)."""
        s = self.settings
        if s.multi_objective_aggregation == "sum_then_normalize":
            return self._advantages_fn(filled, estimator=s.advantage_estimator, std_eps=s.std_eps,
                                       unbiased_std=s.unbiased_std)  # [B, G]
        if per_reward is None:
            raise ValueError("multi_objective_aggregation=normalize_then_sum needs each reward's scores (per_reward)")
        per = per_reward.to(filled.device, filled.dtype)  # [B, G, K]
        # a failed completion leaves the loss; each of its scores takes its group's mean, as its total does,
        # and so does a score a reward did not give (None: not applicable), which then adds 0 to the sum
        missing = failed[..., None] | torch.isnan(per)  # [B, G, K]
        group_mean = torch.nan_to_num(torch.nanmean(per.masked_fill(missing, float("nan")), dim=1,
                                                    keepdim=True), nan=0.0)  # [B, 1, K]
        per = torch.where(missing, group_mean.expand_as(per), per)  # [B, G, K]
        weights = torch.tensor(s.reward_weights or [1.0] * per.shape[-1], dtype=per.dtype, device=per.device)
        return core.gdpo_advantages(per, weights, std_eps=s.std_eps, unbiased_std=s.unbiased_std)


def reshape_rewards(rewards: torch.Tensor, *, lengths: torch.Tensor, truncated: torch.Tensor,
                    shaping: RewardShaping) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Apply the reward-side tools before advantages: the overlong penalty (added to the reward) and
    the PF-PPO filter. rewards: [B, G], lengths and truncated: [B * G] ->
    (rewards [B, G], keep [B, G] bool, metrics)."""
    s, metrics = shaping, {}
    if s.overlong_buffer:  # DAPO soft overlong punishment (arXiv 2503.14476, eq. 13)
        pen = core.overlong_penalty(lengths, max_length=s.max_completion_length,
                                    buffer=s.overlong_buffer).view_as(rewards)  # [B, G]
        rewards = rewards + s.overlong_penalty_coef * pen
        metrics["overlong_penalty_mean"] = float(pen.mean())
    keep = torch.ones_like(rewards, dtype=torch.bool)  # [B, G]
    if s.overlong_filter:  # DAPO overlong filtering: truncated completions leave the loss
        keep &= ~truncated.view_as(rewards)
    if s.policy_filter:  # PF-PPO (arXiv 2409.06957)
        keep &= core.policy_filter(rewards, mode=s.policy_filter, min_std=s.policy_filter_min_std)
        metrics["policy_filter_kept_share"] = float(keep.float().mean())
    return rewards, keep, metrics


def seed_metrics(rewards: torch.Tensor, ro: Rollout, *, correct_at: float) -> dict:
    """The seeds' monitors of a step: GAV on the raw rewards (seed 003 section 3.4), the
    shares of all-correct and all-wrong groups and the per-group reward std (seed 002 section 4), and
    the output diversity and looping of this process's completions (seed 004's entropy-collapse
    symptoms). rewards: [B, G] with failed rewards filled by their group's mean."""
    out = {k: float(v) for k, v in core.group_outcome_shares(rewards, correct_at=correct_at).items()}
    out["reward_group_std"] = float(rewards.std(dim=1, correction=0).mean())
    if rewards.shape[1] >= 2:
        out["gav"] = float(core.group_advantage_std(rewards))
    ids, mask = ro.completion_ids, ro.completion_mask  # [n, T]
    out["distinct_1"] = float(core.distinct_n(ids, mask, n=1))
    out["distinct_2"] = float(core.distinct_n(ids, mask, n=2))
    out["loop_share"] = float(core.loop_flags(ids, mask).float().mean())
    return out


def correction_mode(rollout_correction: str, rollout_engine: str) -> str:
    """The train/inference mismatch correction a run applies: ``rollout_correction``, with auto
    resolved to mask for an engine that samples with kernels of its own (its log-probs differ from
    the trainer's) and to none for one that samples with the trainer's model."""
    if rollout_correction != "auto":
        return rollout_correction
    return "mask" if engine_class(rollout_engine).own_kernels else "none"
