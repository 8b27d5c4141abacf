"""The learned critic of the PPO baseline: a value model, its optimizer, and its health metrics.

GRPO exists to remove this component (DeepSeekMath section 4.1); it is here so that users can
measure what removing it buys (`grpo compare`). Dimension letters: N sequences, T completion tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from grpo import core
from grpo.infra import distributed
from grpo.models.packing import model_inputs
from grpo.train.optim import adamw, clipped_step


def load_value_model(path: str, dtype: torch.dtype) -> nn.Module:
    """A copy of the policy's architecture with a scalar head, initialised from the policy's weights
    (the head itself starts at zero so initial values are 0, not noise), without dropout."""
    from transformers import AutoModelForTokenClassification

    model = AutoModelForTokenClassification.from_pretrained(path, num_labels=1, dtype=dtype)
    head = getattr(model, "score", None) or getattr(model, "classifier", None)
    if isinstance(head, nn.Linear):
        with torch.no_grad():
            head.weight.zero_()
            if head.bias is not None:
                head.bias.zero_()
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = 0
    # no dropout: token-classification heads add one (0.1 for Llama) that would make the values used
    # for GAE random and the critic differ with the random stream (TRL's PPO disables it too)
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    return model


@dataclass(frozen=True)
class CriticSettings:
    """The critic's settings, each its Config field's: estimator (advantage_estimator: an ESTIMATORS
    entry that declares ``critic``, e.g. gae), learning_rate (critic_learning_rate), clip_range
    (cliprange_value; None: no value clipping), max_grad_norm, divergence_factor
    (critic_divergence_factor), vf_coef, shared_trunk (critic_shared_trunk), strategy
    (distributed_strategy), dtype."""

    estimator: str
    learning_rate: float
    clip_range: float | None
    max_grad_norm: float
    divergence_factor: float
    vf_coef: float
    shared_trunk: bool
    strategy: str
    dtype: str


class Critic:
    """Values V(s_t) of the state before each completion token, trained by a clipped value loss.

    Separate (default): a value model of its own, with its own optimizer. Shared trunk
    (``shared_policy`` given): a scalar head on the policy's last hidden state; the value loss,
    scaled by ``vf_coef``, also sends gradients into the policy's body, which the policy's optimizer
    applies together with the policy-loss gradients (the joint loss L_pi + vf_coef * L_V); only the
    head is stepped here. No second model in memory.

    On several processes (``world``) the separate value model is wrapped like the policy (DDP, or
    sharded in place by FSDP2), its loss is normalised by the tokens of all processes, and the
    advantages are whitened and its metrics computed with statistics of all processes, so the
    processes' critics stay one critic. A shared trunk's value-loss gradients stay local in the
    policy's body until the policy's own last micro-batch syncs what has accumulated there (the
    updater trains the critic first), and its head's gradients are averaged over processes.
    """

    def __init__(self, settings: CriticSettings, path: str, *, autocast: bool, shared_policy: nn.Module | None = None,
                 device: torch.device = torch.device("cpu"), world: distributed.World | None = None):
        s = self.settings = settings
        dtype = getattr(torch, s.dtype)
        self.world = world or distributed.World(rank=0, size=1, local_rank=0, device=device)
        self.module = None
        if shared_policy is None:
            self.model, self.head, self.loss_scale = load_value_model(path, dtype).to(device), None, 1.0
            self.model.train()
            # the module the training forward runs through: DDP, the model sharded in place, or itself
            self.module = distributed.wrap_policy(self.model, self.world, s.strategy)
            params = list(self.model.parameters())  # after sharding: FSDP2's parameters
        else:
            hidden = shared_policy.config.hidden_size
            self.model, self.loss_scale = shared_policy, s.vf_coef
            self.head = nn.Linear(hidden, 1, dtype=dtype, device=device)
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)
            params = list(self.head.parameters())
        self.params = params
        self.optimizer = adamw(params, lr=s.learning_rate)
        self.clip_range, self.max_grad_norm = s.clip_range, s.max_grad_norm
        self.divergence_factor, self.autocast = s.divergence_factor, autocast
        self.min_loss = math.inf
        self.divergence_events = 0

    def _values(self, prompt_ids, prompt_mask, completion_ids, completion_mask) -> torch.Tensor:
        """Values [n, T] of the states before each context token (completion_mask: the context)."""
        t_full = completion_ids.shape[1]
        inp = model_inputs(prompt_ids, prompt_mask, completion_ids, completion_mask)
        t = inp.pop("completion_ids").shape[1]
        with torch.autocast(completion_ids.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            if self.head is None:
                out = self.module(**inp).logits  # [N, P' + T', 1]
            else:
                hidden = self.model(**inp, output_hidden_states=True, logits_to_keep=1).hidden_states[-1]
                out = self.head(hidden.to(self.head.weight.dtype))  # [N, P' + T', 1]
        # the value of the state before completion token j sits at position P' - 1 + j
        values = out[:, -t - 1:-1, 0].float()  # [N, T']
        return torch.nn.functional.pad(values, (0, t_full - t))  # [N, T]

    @torch.no_grad()
    def values(self, ro, micro_batch: int) -> torch.Tensor:
        """Values at sampling time, [N, T], for GAE and as the clip anchor of the value loss."""
        parts = [self._values(ro.prompt_ids[i], ro.prompt_mask[i], ro.completion_ids[i], ro.completion_mask[i])
                 for i in torch.arange(ro.completion_ids.shape[0]).split(micro_batch)]
        return torch.cat(parts)

    @torch.no_grad()
    def advantages(self, ro, scores: torch.Tensor, behaviour_logp: torch.Tensor | None,
                   ref_logp: torch.Tensor | None, mask: torch.Tensor, *, kl_coef: float, gamma: float, lam: float,
                   micro_batch: int) -> dict:
        """PPO's token advantages: the outcome score [N] on the last token minus kl_coef times the
        per-token KL between the behaviour policy and the reference (none without a reference),
        GAE over the critic's values, whitened. Returns {"advantages", "returns", "values": [N, T],
        "metrics"}.

        The values are computed on the whole context (ro.completion_mask); ``mask`` [N, T] is the loss
        tokens that count (within ro.loss_mask). Rewards, GAE, whitening and metrics use ``mask``
        alone: GAE steps over the tokens outside it (core.gae carries the next loss token's value
        and advantage through them), so a hole such as a tool's output is part of the environment's
        transition between two of the model's tokens. Why skip rather than run GAE over the context
        with zero reward on holes: the value loss trains only loss tokens, so the values inside a hole
        are never fitted and would enter every delta around it; skipped, only fitted values are used.
        Without holes both rules are the same."""
        values = self.values(ro, micro_batch)  # [N, T]
        behaviour = torch.zeros_like(values) if behaviour_logp is None else behaviour_logp  # [N, T]
        rewards_tok = core.kl_shaped_rewards(scores, behaviour, ref_logp, mask, kl_coef=kl_coef)  # [N, T]
        estimate = core.ESTIMATORS[self.settings.estimator]  # a critic estimator: gae's signature
        est = estimate(rewards_tok, values, mask, gamma=gamma, lam=lam)
        # statistics over every process's tokens (on one process, its own: the same as core.whiten,
        # core.masked_mean and core.explained_variance): one whitening and one set of metrics a step
        m = mask.to(values.dtype)  # [N, T]
        count = distributed.all_sum(m.sum(), self.world).clamp(min=1)  # []
        adv_mean, adv_var = self._moments(est["advantages"], m, count)
        _, ret_var = self._moments(est["returns"], m, count)
        _, res_var = self._moments(est["returns"] - values, m, count)
        metrics = {"value_mean": float(distributed.all_sum((values * m).sum(), self.world) / count),
                   "explained_variance": float(1 - res_var / ret_var.clamp(min=1e-12))}
        return {"advantages": core.whiten(est["advantages"], mask, mean=adv_mean, var=adv_var),
                "returns": est["returns"], "values": values, "metrics": metrics}

    def _moments(self, x: torch.Tensor, m: torch.Tensor, count: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and variance of x [N, T] over the tokens where m [N, T] is 1 on every process (``count``
        of them)."""
        return core.masked_moments(x, m, count=count, reduce=lambda part: distributed.all_sum(part, self.world))

    def update(self, ro, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, *,
               micro_batch: int) -> dict:
        """One optimizer step of the clipped value loss over the (mini-)batch, in micro-batches; its
        loss, clip fraction and gradient norm (step_metrics folds a training step's updates). Values
        run on the context (ro.completion_mask); the loss and its token weights count ``mask`` [N, T]
        (the loss tokens)."""
        n = ro.completion_ids.shape[0]
        # every process's tokens, over world: DDP and FSDP2 average the gradients into the batch's sum
        total_tokens = (distributed.all_sum(mask.sum(), self.world) / self.world.size).clamp(min=1)
        self.optimizer.zero_grad(set_to_none=True)
        sums = torch.zeros(2, dtype=torch.float64)  # this process's shares of the loss and clip fraction
        micro = torch.arange(n).split(micro_batch)
        for i, idx in enumerate(micro):
            # shared trunk: never synced here (the policy's last micro-batch reduces its body's gradients)
            last = i == len(micro) - 1 and self.head is None
            with distributed.grad_sync(self.module or self.model, self.world, enabled=last):
                v = self._values(ro.prompt_ids[idx], ro.prompt_mask[idx], ro.completion_ids[idx],
                                 ro.completion_mask[idx])  # [n, T]
                out = core.clipped_value_loss(v, old_values[idx], returns[idx], mask[idx],
                                              clip_range=self.clip_range)
                share = mask[idx].sum() / total_tokens  # token-weighted: micro-batches add up to the batch
                (out["loss"] * share * self.loss_scale).backward()
            sums += torch.stack([out["loss"].detach() * share, out["clip_fraction"] * share]).double().cpu()
        loss_sum, clip_sum = (distributed.all_sum(sums, self.world) / self.world.size).tolist()
        if self.head is not None:
            distributed.average_grads(self.params, self.world)
        norm = clipped_step(self.params, self.optimizer, max_grad_norm=self.max_grad_norm)
        return {"value_loss": loss_sum, "value_clip_fraction": clip_sum, "value_grad_norm": norm}

    def step_metrics(self, updates: list[dict]) -> dict:
        """A training step's critic metrics from its updates (one per pass and mini-batch): their means,
        and a divergence check on the mean value loss against the lowest mean seen so far."""
        if not updates:
            return {}
        out = {k: sum(u[k] for u in updates) / len(updates) for k in updates[0]}
        diverged = math.isfinite(self.min_loss) and out["value_loss"] > self.divergence_factor * self.min_loss
        self.divergence_events += int(diverged)
        self.min_loss = min(self.min_loss, out["value_loss"])
        return {**out, "value_grad_norm_max": max(u["value_grad_norm"] for u in updates),
                "critic_diverged": int(diverged), "critic_divergence_events": self.divergence_events}

    def state_dict(self) -> dict:
        """Unsharded and keyed by parameter name (a collective under FSDP2: every process calls it),
        so it resumes on any number of processes. Shared trunk: the body is the policy, saved with
        it; only the head is the critic's own."""
        own = self.model if self.head is None else self.head
        return {"model": distributed.full_model_state(own), "optimizer": distributed.full_optimizer_state(own, self.optimizer),
                "min_loss": self.min_loss, "divergence_events": self.divergence_events}

    def load_state_dict(self, state: dict) -> None:
        own = self.model if self.head is None else self.head
        distributed.load_full_model_state(own, state["model"])
        distributed.load_full_optimizer_state(own, self.optimizer, state["optimizer"])
        self.min_loss, self.divergence_events = state["min_loss"], state["divergence_events"]
