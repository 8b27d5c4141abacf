"""GRPO and PPO for the path-tracking task, on grpo.core's advantage and loss functions.

Dimension letters: B groups (scenarios), G episodes per group, N = B*G episodes, T steps, M steps
of a batch (flattened), D observation size.

Both agents collect whole episodes, turn them into one advantage per step, and update the policy
with the core's clipped loss (``clip_loss``: clipped surrogate + KL + entropy bonus, token-mean
aggregation over steps) for ``epochs`` passes of shuffled mini-batches, clipping the gradient norm.

GRPO (seed section 9.2): every group runs G episodes from the same start state on the same path; the
baseline is the group's mean return (``compute_advantages`` with the ``dr_grpo`` estimator, r - group
mean, the seed's ``returns - returns.mean``). Variant ``outcome`` gives every step its episode's
advantage; ``step`` gives step t its return-to-go minus the group's mean return-to-go at step t (an
episode that has ended counts 0 there), the same estimator on [B*T, G]. The KL term is to the old
(sampling) policy, the seed's choice, with the core's k3 estimator on the sampled actions.
No value network.

PPO (Schulman et al. 2017): a value network, GAE (``gae``), whitened advantages (``whiten``), no KL
term, and the value loss (``clipped_value_loss`` without clipping) in the same optimiser.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from grpo.pathtracking.base import Agent, ControllerSettings, StepBatch, flatten, settings_from
from grpo.pathtracking.nets import ValueNet
from grpo.pathtracking.paths import random_scenario
from grpo.pathtracking.rollout import Episodes
from grpo.pathtracking.trpo import TRPOAgent
from grpo.core import compute_advantages
from grpo.registry import Registry


def group_advantages(rewards: Tensor, mask: Tensor, *, group_size: int, variant: str = "outcome",
                     estimator: str = "dr_grpo") -> Tensor:
    """GRPO's per-step advantages of N = B*G episodes, groups consecutive. rewards, mask: [N, T] -> [N, T].

    outcome: the episode's return against its group's returns, on every step. step: the return-to-go
    at step t against the group's returns-to-go at step t (0 for an episode already over).
    """
    n, t = rewards.shape
    if n % group_size:
        raise ValueError(f"group_advantages: N = {n} is not a multiple of group_size = {group_size}")
    b = n // group_size
    r = rewards * mask  # [N, T]
    if variant == "outcome":
        adv = compute_advantages(r.sum(1).view(b, group_size), estimator=estimator)  # [B, G]
        return adv.reshape(n, 1) * mask  # [N, T]
    if variant == "step":
        rtg = r.flip(1).cumsum(1).flip(1)  # [N, T] return from step t on
        per_t = rtg.view(b, group_size, t).transpose(1, 2).reshape(b * t, group_size)  # [B*T, G]
        adv = compute_advantages(per_t, estimator=estimator)  # [B*T, G]
        return adv.view(b, t, group_size).transpose(1, 2).reshape(n, t) * mask  # [N, T]
    raise ValueError(f"unknown GRPO variant {variant!r}; valid: ['outcome', 'step']")


class GRPOAgent(Agent):
    """GRPO: groups of G episodes per scenario, group-mean-return baseline, no critic (module docstring)."""

    algo = "grpo"

    def __init__(self, settings: ControllerSettings, *, variant: str = "outcome", log=print):
        super().__init__(settings, log=log)
        self.variant = variant
        self.algo = "grpo" if variant == "outcome" else "grpo_step"
        self.opt = torch.optim.Adam(self.policy.parameters(), lr=settings.lr)

    def batch(self) -> Episodes:
        scen = [random_scenario(self.rng) for _ in range(self.s.groups)]
        return self.collect([sc for sc in scen for _ in range(self.s.group_size)])  # groups consecutive

    def update(self, ep: Episodes) -> None:
        adv = group_advantages(ep.rewards, ep.mask, group_size=self.s.group_size, variant=self.variant,
                               estimator=self.s.estimator)  # [N, T]
        self.policy_step(flatten(ep, adv), kl_coef=self.s.kl_coef)


class PPOAgent(Agent):
    """PPO with a value network and GAE; one Adam over both networks, as in SB3 (module docstring)."""

    algo = "ppo"

    def __init__(self, settings: ControllerSettings, *, log=print):
        super().__init__(settings, log=log)
        self.critic = ValueNet()
        self.params = list(self.policy.parameters()) + list(self.critic.parameters())
        self.opt = torch.optim.Adam(self.params, lr=settings.lr)

    def batch(self) -> Episodes:
        return self.collect([random_scenario(self.rng) for _ in range(self.s.batch_episodes)])

    def update(self, ep: Episodes) -> None:
        self.policy_step(self.gae_batch(ep), kl_coef=0.0, params=self.params, value_coef=self.s.value_coef)


# name -> (settings, *, log) -> Agent: what `grpo control train --algo` and `compare --algos` pick from
AGENTS: Registry[Callable[..., Agent]] = Registry("control algorithm", field="--algo")
AGENTS.register("grpo", lambda settings, *, log=print: GRPOAgent(settings, variant="outcome", log=log),
                doc=GRPOAgent.__doc__ + " Every step gets its episode's advantage.")
AGENTS.register("grpo_step", lambda settings, *, log=print: GRPOAgent(settings, variant="step", log=log),
                doc=GRPOAgent.__doc__ + " Step t gets its return-to-go against the group's at step t.")
AGENTS.register("ppo", PPOAgent)
AGENTS.register("trpo", TRPOAgent)


def make_agent(algo: str, settings: ControllerSettings, *, log=print) -> Agent:
    """The agent of one of AGENTS; an unknown name lists them."""
    return AGENTS[algo](settings, log=log)


__all__ = ["AGENTS", "Agent", "ControllerSettings", "GRPOAgent", "PPOAgent", "StepBatch", "flatten",
           "TRPOAgent", "group_advantages", "make_agent", "settings_from"]
