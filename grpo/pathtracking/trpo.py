"""TRPO (Schulman et al. 2015) for the path-tracking task: a natural-gradient step under a KL bound.

Dimension letters: M steps of a batch, A actions, P policy parameters (flattened).

The step maximises the surrogate L(theta) = mean(ratio * A) subject to mean KL(pi_old || pi_theta)
<= max_kl: conjugate gradient solves F s = g for the Fisher matrix F (the KL's Hessian, applied by
Hessian-vector products, plus damping), the step is scaled to the trust region's edge,
sqrt(2 max_kl / s^T F s) s, and a backtracking line search halves it until the KL bound holds and
the surrogate improves. The advantages are GAE's from a value network trained by Adam, as PPO's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from grpo.pathtracking.base import Agent, ControllerSettings, StepBatch
from grpo.pathtracking.nets import PolicyNet, ValueNet
from grpo.pathtracking.paths import random_scenario
from grpo.core import aggregate, clipped_value_loss
from grpo.pathtracking.rollout import Episodes


def conjugate_gradient(fvp: Callable[[Tensor], Tensor], b: Tensor, *, iters: int = 10,
                       tol: float = 1e-10) -> Tensor:
    """Approximately solve F x = b for a symmetric positive-definite F given only x -> F x. [P] -> [P]."""
    x = torch.zeros_like(b)  # [P]
    r, p = b.clone(), b.clone()  # [P]
    rr = r @ r
    for _ in range(iters):
        fp = fvp(p)  # [P]
        alpha = rr / (p @ fp)
        x = x + alpha * p
        r = r - alpha * fp
        rr_new = r @ r
        if rr_new < tol:
            break
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x


def _flat_grad(y: Tensor, params: list[Tensor], **kw) -> Tensor:
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(y, params, **kw)])  # [P]


def _set_flat(params: list[Tensor], flat: Tensor) -> None:
    i = 0
    for p in params:
        p.data.copy_(flat[i:i + p.numel()].view_as(p))
        i += p.numel()


@dataclass
class TrustRegionStep:
    """What one TRPO step did: the accepted KL and surrogate gain, and how many halvings it took."""

    kl: float
    improvement: float
    halvings: int
    accepted: bool


def trpo_step(policy: PolicyNet, obs: Tensor, actions: Tensor, advantages: Tensor, *, max_kl: float,
              cg_iters: int = 10, damping: float = 0.1, line_search_steps: int = 10) -> TrustRegionStep:
    """One trust-region step of ``policy`` in place on M steps (obs [M, D], actions [M], advantages [M]).

    The policy before the step is pi_old. The new parameters satisfy mean KL(pi_old || pi_new) <=
    max_kl on these observations with a surrogate gain > 0, or the old ones are kept (accepted False).
    """
    params = [p for p in policy.parameters() if p.requires_grad]
    with torch.no_grad():
        old_logits = policy(obs).detach()  # [M, A]
        old_logp_all = torch.log_softmax(old_logits, -1)  # [M, A]
        old_logp = old_logp_all.gather(1, actions[:, None])[:, 0]  # [M]
    ones = torch.ones_like(advantages)[None]  # [1, M]

    def surrogate() -> Tensor:
        logp = torch.log_softmax(policy(obs), -1).gather(1, actions[:, None])[:, 0]  # [M]
        return aggregate((torch.exp(logp - old_logp) * advantages)[None], ones, mode="token_mean")

    def mean_kl() -> Tensor:
        logp_all = torch.log_softmax(policy(obs), -1)  # [M, A]
        return (old_logp_all.exp() * (old_logp_all - logp_all)).sum(-1).mean()

    g = _flat_grad(surrogate(), params)  # [P]
    if not torch.isfinite(g).all() or g.abs().max() == 0:
        return TrustRegionStep(0.0, 0.0, 0, False)
    grad_kl = _flat_grad(mean_kl(), params, create_graph=True)  # [P]

    def fvp(v: Tensor) -> Tensor:
        return _flat_grad(grad_kl @ v, params, retain_graph=True) + damping * v  # [P]

    step_dir = conjugate_gradient(fvp, g, iters=cg_iters)  # [P]
    shs = step_dir @ fvp(step_dir)
    full = step_dir * torch.sqrt(2 * max_kl / shs.clamp(min=1e-12))  # [P] at the trust region's edge
    old = torch.cat([p.data.reshape(-1) for p in params])  # [P]
    with torch.no_grad():
        base = surrogate()
        for k in range(line_search_steps):
            _set_flat(params, old + full * 0.5 ** k)
            kl, gain = mean_kl(), surrogate() - base
            if torch.isfinite(kl) and kl <= max_kl and gain > 0:
                return TrustRegionStep(float(kl), float(gain), k, True)
        _set_flat(params, old)
    return TrustRegionStep(0.0, 0.0, line_search_steps, False)


class TRPOAgent(Agent):
    """TRPO: GAE from a value network, one trust-region policy step per batch (module docstring)."""

    algo = "trpo"

    def __init__(self, settings: ControllerSettings, *, log=print):
        super().__init__(settings, log=log)
        self.critic = ValueNet()
        self.value_opt = torch.optim.Adam(self.critic.parameters(), lr=settings.value_lr)
        self.last_step: TrustRegionStep | None = None

    def batch(self) -> Episodes:
        return self.collect([random_scenario(self.rng) for _ in range(self.s.batch_episodes)])

    def update(self, ep: Episodes) -> None:
        b = self.gae_batch(ep)
        s = self.s
        self.last_step = trpo_step(self.policy, b.obs, b.actions, b.advantages, max_kl=s.max_kl,
                                   cg_iters=s.cg_iters, damping=s.cg_damping,
                                   line_search_steps=s.line_search_steps)
        self._fit_critic(b)

    def _fit_critic(self, b: StepBatch) -> None:
        m = b.obs.shape[0]
        for _ in range(self.s.value_epochs):
            order = torch.randperm(m, generator=self.gen)
            for lo in range(0, m, self.s.minibatch):
                idx = order[lo:lo + self.s.minibatch]
                v = self.critic(b.obs[idx])[None]  # [1, m]
                loss = clipped_value_loss(v, b.old_values[idx][None], b.returns[idx][None], torch.ones_like(v),
                                          clip_range=None)["loss"]
                self.value_opt.zero_grad()
                loss.backward()
                self.value_opt.step()


__all__ = ["ControllerSettings", "TRPOAgent", "TrustRegionStep", "conjugate_gradient", "trpo_step"]
