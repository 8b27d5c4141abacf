"""The update, the second half of a step: mu epochs over the batch, each one optimizer step per
mini-batch of the clipped objective (+ beta * KL), gradients accumulated over micro-batches cut into
forward chunks of bounded size.

Dimension letters: N sequences (n on this process), T completion tokens.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from grpo import core
from grpo.infra import distributed
from grpo.rollout.types import select_rollout
from grpo.train import split
from grpo.train.batch import Batch
from grpo.train.compiled import loss_and_advantage_functions
from grpo.train.optim import Schedule, adamw, clipped_step, lr_lambda

# handled apart from the loss's other outputs: weighted by 1 / the update's optimizer steps, not by tokens
LOSS_KEYS = ("loss", "policy_loss")


@dataclass(frozen=True)
class UpdateSettings:
    """What the update reads; each field is the Config field named in its comment."""

    policy_loss: str  # policy_loss: the entry of core.POLICY_LOSSES
    loss: core.LossSettings  # its hyper-parameters (the knobs' fields and ``total`` are set per step)
    group_size: int  # num_generations (G)
    num_iterations: int  # num_iterations (mu): passes over the batch
    mini_batches: int  # mini_batches: optimizer steps per pass
    micro_batch: int  # per_device_train_batch_size: sequences per forward/backward micro-batch
    skip_zero_advantage: bool  # skip_zero_advantage
    entropy_target: bool  # entropy_target_band is set (its controller reads the whole batch's entropy)
    learning_rate: float  # learning_rate (AdamW's peak)
    adam_betas: tuple[float, float]  # adam_beta1, adam_beta2
    weight_decay: float  # weight_decay
    schedule: Schedule  # lr_scheduler_type, warmup_steps, max_steps
    max_grad_norm: float  # max_grad_norm (0: no clipping)
    max_consecutive_skips: int  # max_consecutive_skips
    torch_compile: bool = False  # torch_compile: the policy loss computed by torch.compile (train/compiled.py)


def _scalar(value) -> torch.Tensor:
    """A loss output as a detached float64 scalar tensor, on its device (no sync)."""
    return torch.as_tensor(value).detach().to(torch.float64)


@dataclass
class UpdateStats:
    """What an update accumulates over its micro-batches: token-weighted sums of the loss's outputs and
    the tokens they weigh, as float64 tensors read once when the update ends (as torchtune's GRPOStats
    keeps a step's statistics as tensors); each optimizer step's gradient norm; the critic's metrics;
    with deferred importance weights, the forward's log-probs [n, T]."""

    logps: torch.Tensor | None = None
    sums: dict = field(default_factory=dict)  # name -> [] float64
    tokens: torch.Tensor = field(default_factory=lambda: torch.zeros((), dtype=torch.float64))
    grad_norms: list = field(default_factory=list)
    critic: list = field(default_factory=list)

    def add(self, key: str, value: torch.Tensor) -> None:
        self.sums[key] = self.sums[key] + value if key in self.sums else value


class Updater:
    """Owns the policy's optimizer and schedule and the count of skipped (non-finite) updates;
    ``module`` is what the training forward runs through (the policy, its DDP wrapper, or the policy
    sharded in place by FSDP2); ``critic`` (PPO) is trained on the same mini-batches; ``loss`` is the
    configured entry of core.POLICY_LOSSES."""

    def __init__(self, settings: UpdateSettings, *, world: distributed.World, policy, module, forwards, critic,
                 checkpoint_dir: Path):
        self.settings, self.world, self.policy, self.module = settings, world, policy, module
        self.forwards, self.critic, self.checkpoint_dir = forwards, critic, checkpoint_dir
        self.loss = core.get_policy_loss(settings.policy_loss)
        self._policy_loss, _ = loss_and_advantage_functions(settings.torch_compile)  # core.policy_loss, maybe compiled
        params = [p for p in policy.parameters() if p.requires_grad]  # LoRA: adapters only
        self.optimizer = adamw(params, lr=settings.learning_rate, betas=settings.adam_betas,
                               weight_decay=settings.weight_decay)
        per_step = settings.num_iterations * settings.mini_batches  # optimizer steps per training step
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(settings.schedule, per_step))
        self.skipped_updates = 0
        self.consecutive_skips = 0

    def reschedule(self, schedule: Schedule) -> None:
        """Count the learning-rate schedule to another run length (max_steps raised to train further),
        as a resume with it would: the steps taken stay, the multiplier follows the new schedule."""
        self.settings = replace(self.settings, schedule=schedule)
        per_step = self.settings.num_iterations * self.settings.mini_batches
        self.scheduler.lr_lambdas = [lr_lambda(schedule, per_step)]

    def loss_settings(self, batch: Batch, knobs) -> core.LossSettings:
        """This step's policy-loss settings: the run's, with the knobs' values (``knobs``: this step's
        epsilon, eps_high, beta, entropy_coef); the KL term only where it is not in the reward (PPO)."""
        k = knobs
        return replace(self.settings.loss, eps_low=k.epsilon, eps_high=k.eps_high,
                       kl_coef=k.beta if batch.kl_in_loss else 0.0, entropy_coef=k.entropy_coef)

    def update(self, batch: Batch, knobs, *, step: int) -> dict:
        """mu epochs over the batch; each epoch takes one optimizer step per mini-batch, accumulating
        its micro-batch gradients. ``knobs``: this step's epsilon, beta, entropy_coef, temperature."""
        s, ro, world = self.settings, batch.rollout, self.world
        n = ro.completion_ids.shape[0]
        loss = self.loss_settings(batch, knobs)  # once per step; each mini-batch sets its denominator
        rows = self.trained_rows(batch, loss)  # [n'] the sequences that can have a gradient
        minis = split.mini_batch_rows(n // s.group_size, s.group_size, s.mini_batches)
        # tokens that count in each mini-batch, over all processes: one without any (absent, filtered or
        # failed groups) has no loss and takes no optimizer step, though the schedule moves on
        counts = distributed.all_sum(torch.stack([batch.mask[m].sum() for m in minis]).double(), world).tolist()
        steps = s.num_iterations * sum(c > 0 for c in counts)  # optimizer steps of this update
        if batch.deferred and steps > 1:
            raise ValueError("importance weights left to the update's forward need one optimizer step per "
                             "training step; with num_iterations or mini_batches above 1 the batch carries "
                             "the old policy's log-probs")
        acc = UpdateStats(logps=torch.zeros_like(batch.advantages) if batch.deferred else None)  # [n, T]
        for _ in range(s.num_iterations):
            for mini, count in zip(minis, counts):
                if count == 0:
                    with warnings.catch_warnings():  # before the run's first optimizer step PyTorch warns
                        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
                        self.scheduler.step()
                    continue
                # the loss's denominator is the mini-batch's (tokens or sequences over all processes); DDP
                # and FSDP2 average gradients over processes, so each divides by total / world for a sum
                total = (count if loss.aggregation == "token_mean" else len(mini) * world.size) / world.size
                live = mini[torch.isin(mini, rows)] if len(rows) < n else mini  # [m'] sequences with a gradient
                self.optimizer.zero_grad(set_to_none=True)
                if self.critic is not None:  # PPO epochs train the critic on the same mini-batch, first: with
                    # a shared trunk its value-loss gradients wait in the policy's body, and the policy's last
                    # micro-batch below syncs them with its own (DDP and FSDP2 reduce what has accumulated)
                    acc.critic.append(self.critic.update(select_rollout(ro, mini), batch.values[mini],
                                                            batch.returns[mini], batch.mask[mini],
                                                            micro_batch=s.micro_batch))
                self._mini_batch(batch, live, replace(loss, total=total), acc, knobs.temperature,
                                 weight=1.0 / steps)
                acc.grad_norms.append(self._optimizer_step(step))
        metrics = self._metrics(acc, n, len(rows))
        for weight in batch.deferred:  # over the rows that went through the forward
            corr = weight.weigh(acc.logps[rows], rows)
            metrics.update({weight.prefix + k: float(v) for k, v in corr.metrics.items()})
            metrics[weight.prefix + "rollout_is_sequences"] = float(len(rows))
        return metrics

    def _metrics(self, acc: UpdateStats, n: int, n_trained: int) -> dict:
        """Token-weighted means and loss shares of every process (each loss share is world x its part),
        the update's sums read once."""
        world = self.world
        keys = sorted(acc.sums)
        local = torch.stack([acc.sums[k] for k in keys] + [acc.tokens]).cpu()  # [K + 1] float64, the one sync
        summed = distributed.all_sum(local, world)
        sums, tokens_seen = dict(zip(keys, summed[:-1].tolist())), float(summed[-1])
        metrics = {k: v / max(tokens_seen, 1.0) for k, v in sums.items() if k not in LOSS_KEYS}
        norms = acc.grad_norms or [0.0]
        metrics.update(loss=sums.get("loss", 0.0) / world.size, policy_loss=sums.get("policy_loss", 0.0) / world.size,
                       grad_norm=norms[-1], grad_norm_max=max(norms), optimizer_steps=len(acc.grad_norms),
                       trained_sequence_share=n_trained / max(n, 1),
                       skipped_updates=self.skipped_updates, learning_rate=self.scheduler.get_last_lr()[0])
        if self.critic is not None:
            metrics.update(self.critic.step_metrics(acc.critic))
        return metrics

    def _mini_batch(self, batch: Batch, rows: torch.Tensor, loss: core.LossSettings, acc: UpdateStats, temperature: float,
                    *, weight: float) -> None:
        """Forward and backward passes over one mini-batch's ``rows`` [m], in micro-batches cut into
        forward chunks of bounded size; the gradients accumulate onto those already there (a shared
        trunk's value-loss gradients) and are synced on the last chunk. ``loss``:
        this step's settings with the mini-batch's denominator. Adds the token-weighted metric sums,
        and the loss times ``weight`` (1 / the update's optimizer steps), to ``acc``."""
        world = self.world
        todo = [c for rows_mb in rows.split(self.settings.micro_batch)
                for c in self.forwards.chunks(batch.rollout, rows_mb)]
        for i, idx in enumerate(todo):
            with distributed.grad_sync(self.module, world, enabled=i == len(todo) - 1):
                out = self._micro_loss(batch, idx, loss, temperature, seen=acc.logps)
                out["loss"].backward()
            w = batch.mask[idx].sum().double()  # [] token weight of this micro-batch's means
            acc.tokens = acc.tokens + w
            for key, value in out.items():  # every diagnostic the loss returns, token-weighted
                if key not in LOSS_KEYS:
                    acc.add(key, _scalar(value) * w)
            acc.add("loss", _scalar(out["loss"]) * weight)
            acc.add("policy_loss", _scalar(out["policy_loss"]) * weight)

    def trained_rows(self, batch: Batch, loss: core.LossSettings) -> torch.Tensor:
        """The sequences that go through forward and backward: with skip_zero_advantage, mu = 1, one
        mini-batch, no critic and no entropy target, and a loss that declares that a zero-advantage
        sequence cannot change the gradient under this step's settings ``loss`` (no KL, entropy or
        covariance term for "clip"), those with a non-zero advantage (split.rows_with_gradient); the
        loss's denominator still counts the others, so the loss is unchanged. All of them on more than
        one process (DDP needs each to run the same micro-batches), with mu > 1 or several mini-batches
        (the ratio moves off 1), with a critic and under an entropy target (its controller reads the
        entropy of the whole batch)."""
        s = self.settings
        if (not s.skip_zero_advantage or self.world.distributed or s.num_iterations > 1 or s.mini_batches > 1
                or self.critic is not None or s.entropy_target or self.loss.zero_advantage_has_gradient(loss)):
            return torch.arange(batch.mask.shape[0])
        return split.rows_with_gradient(batch.advantages, batch.mask, group_size=s.group_size)

    def _micro_loss(self, batch: Batch, idx: torch.Tensor, loss: core.LossSettings, temperature: float, *,
                    seen: torch.Tensor | None = None) -> dict:
        """The policy loss on micro-batch rows ``idx``, through the (possibly wrapped) policy; the
        batch's deferred importance weights (batch.LogpWeight) from this forward's detached log-probs,
        which are also written to ``seen`` [n, T] for their metrics."""
        ro = batch.rollout
        cur = self.forwards.logprobs(self.module, ro, idx, temperature=temperature,
                                     with_entropy=self.loss.needs_entropy(loss),
                                     with_q=bool(batch.deferred) and batch.old_qlogp is None)
        logp = cur["logp"]  # [n, T]
        old = batch.old_logp[idx] if batch.old_logp is not None else logp.detach()
        # what the deferred corrections compare with the engine's log q: the trainer's log q where q is not pi_T
        old_q = batch.old_qlogp[idx] if batch.old_qlogp is not None else cur["qlogp"] if "qlogp" in cur else old
        advantages = batch.advantages[idx]  # [n, T]
        weights = batch.weights[idx] if batch.weights is not None else None  # [n, T]
        for weight in batch.deferred:  # w >= 0 scales the advantages (and a term without them: LossInputs.weight)
            w = weight.weigh(old_q, idx).weights  # [n, T]
            advantages, weights = advantages * w, w if weights is None else weights * w
        if seen is not None:
            seen[idx] = old_q
        return self._policy_loss(
            logp, old, advantages, batch.mask[idx], name=self.settings.policy_loss,
            ref_logp=batch.ref_logp[idx] if batch.ref_logp is not None else None,
            entropy=cur["entropy"], weight=weights, settings=loss)

    def _optimizer_step(self, step: int) -> float:
        norm = clipped_step([p for p in self.policy.parameters() if p.grad is not None], self.optimizer,
                            max_grad_norm=self.settings.max_grad_norm)
        if math.isfinite(norm):
            self.consecutive_skips = 0
        else:
            self.skipped_updates += 1  # a non-finite gradient never reaches the weights
            self.consecutive_skips += 1
            if self.consecutive_skips >= self.settings.max_consecutive_skips:
                raise FloatingPointError(
                    f"{self.consecutive_skips} consecutive updates had a non-finite loss or gradient norm "
                    f"(step {step + 1}); stopping. Lower learning_rate, check rewards, or raise "
                    f"max_consecutive_skips. The last good checkpoint is in {self.checkpoint_dir}")
        self.scheduler.step()
        return norm

    def state_dict(self) -> dict:
        # the optimizer keyed by parameter name and unsharded: resumable on any number of processes
        return {"optimizer": distributed.full_optimizer_state(self.policy, self.optimizer),
                "scheduler": self.scheduler.state_dict(), "skipped_updates": self.skipped_updates,
                "consecutive_skips": self.consecutive_skips}

    def load_state_dict(self, state: dict) -> None:
        distributed.load_full_optimizer_state(self.policy, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.skipped_updates, self.consecutive_skips = state["skipped_updates"], state["consecutive_skips"]
