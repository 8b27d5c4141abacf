"""What the path-tracking agents share: their settings, the flattened step batch, and the
collect-update-log loop (``Agent``) that GRPO, PPO (grpo.pathtracking.agents) and TRPO (grpo.pathtracking.trpo)
subclass.

Dimension letters: N episodes, T steps, M steps of a batch (flattened), D observation size.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import Tensor

from grpo.pathtracking.env import PathTrackingEnv
from grpo.pathtracking.nets import PolicyNet, ValueNet
from grpo.pathtracking.rollout import Episodes, StepCounter, policy_controller, run_episodes
from grpo.core import LossInputs, LossSettings, clip_loss, clipped_value_loss, gae, whiten
from grpo.errors import ConfigError


@dataclass
class ControllerSettings:
    """Every knob of the three agents; the defaults are the seed's (section 9.2) where it gives one."""

    lr: float = 3e-4  # policy learning rate (seed GRPO_POLICY_LR)
    epochs: int = 4  # passes over each batch (seed GRPO_EPOCHS)
    kl_coef: float = 0.005  # GRPO's KL to the old policy (seed GRPO_KL_COEF)
    entropy_coef: float = 1e-3  # entropy bonus (seed GRPO_ENTROPY_COEF)
    max_grad_norm: float = 0.5  # seed GRPO_MAX_GRAD_NORM
    clip: float = 0.2  # clip range of the ratio (seed PPO_CLIP_EPS)
    episodes: int = 3000  # training episodes (seed EPISODES_MAP["grpo"])
    log_every: int = 100  # episodes between log lines (seed main.py)
    group_size: int = 8  # GRPO: episodes per scenario
    groups: int = 2  # GRPO: scenarios per update (group_size * groups episodes a batch)
    estimator: str = "dr_grpo"  # GRPO: grpo.core estimator of the group baseline (seed: r - group mean)
    batch_episodes: int = 16  # PPO / TRPO: episodes per update
    minibatch: int = 256  # steps per mini-batch (GRPO, PPO, the critic of TRPO)
    gamma: float = 0.99  # PPO / TRPO discount
    gae_lambda: float = 0.95
    value_coef: float = 0.5  # PPO: weight of the value loss
    value_lr: float = 1e-3  # TRPO: the critic's learning rate
    value_epochs: int = 5  # TRPO: critic passes per batch
    max_kl: float = 0.01  # TRPO: trust region, mean KL(old || new)
    cg_iters: int = 10  # TRPO: conjugate-gradient iterations
    cg_damping: float = 0.1  # TRPO: damping added to the Fisher-vector product
    line_search_steps: int = 10  # TRPO: backtracking halvings
    seed: int = 0


def settings_from(overrides: dict[str, str]) -> ControllerSettings:
    """ControllerSettings with ``key=value`` strings applied; an unknown key lists the valid ones."""
    valid = {f.name: f.type for f in fields(ControllerSettings)}
    out = ControllerSettings()
    for key, raw in overrides.items():
        if key not in valid:
            raise ConfigError(f"unknown control setting {key!r}; valid: {sorted(valid)}")
        cast = {"float": float, "int": int, "str": str}[valid[key]]
        try:
            setattr(out, key, cast(raw))
        except ValueError:
            raise ConfigError(f"control setting {key}={raw!r}: expected {valid[key]}") from None
    return out


@dataclass
class StepBatch:
    """A batch's steps, flattened to the M steps actually taken."""

    obs: Tensor  # [M, D]
    actions: Tensor  # [M]
    old_logp: Tensor  # [M]
    advantages: Tensor  # [M]
    returns: Tensor | None = None  # [M] value targets (PPO, TRPO)
    old_values: Tensor | None = None  # [M]


def flatten(ep: Episodes, advantages: Tensor, returns: Tensor | None = None,
            values: Tensor | None = None) -> StepBatch:
    """[N, T] per-step tensors -> the [M] steps where the mask is 1."""
    keep = ep.mask.bool()  # [N, T]
    return StepBatch(ep.obs[keep], ep.actions[keep], ep.logp[keep], advantages[keep],
                     None if returns is None else returns[keep], None if values is None else values[keep])


class Agent:
    """Collect, update, log: the loop all three algorithms share. Subclasses define ``batch`` and ``update``."""

    algo = ""
    critic: ValueNet | None = None

    def __init__(self, settings: ControllerSettings, *, log=print):
        self.s, self.log = settings, log
        torch.manual_seed(settings.seed)
        self.rng = np.random.default_rng(settings.seed)
        self.gen = torch.Generator().manual_seed(settings.seed)
        self.policy = PolicyNet()
        self.envs: list[PathTrackingEnv] = []
        self.counter = StepCounter()
        self.episodes_done = 0

    def _envs(self, n: int) -> list[PathTrackingEnv]:
        while len(self.envs) < n:
            self.envs.append(PathTrackingEnv())
        return self.envs[:n]

    def collect(self, scenarios) -> Episodes:
        ctl = policy_controller(self.policy, generator=self.gen)
        return run_episodes(ctl, self._envs(len(scenarios)), scenarios, counter=self.counter)

    def train(self, *, episodes: int | None = None, env_steps: int | None = None) -> StepCounter:
        """Train until ``episodes`` episodes (default: the settings') or ``env_steps`` steps are done."""
        goal = self.s.episodes if episodes is None and env_steps is None else episodes
        next_log = self.episodes_done + self.s.log_every
        while not ((goal is not None and self.episodes_done >= goal)
                   or (env_steps is not None and self.counter.steps >= env_steps)):
            ep = self.batch()
            self.update(ep)
            self.episodes_done += ep.mask.shape[0]
            if self.episodes_done >= next_log:
                recent = [r for _, r in self.counter.curve[-self.s.log_every:]]
                self.log(f"[{self.algo}] episode {self.episodes_done}  env steps {self.counter.steps}  "
                         f"mean return (last {len(recent)}) {np.mean(recent):.2f}")
                next_log += self.s.log_every
        return self.counter

    def policy_step(self, batch: StepBatch, *, kl_coef: float, params=None, value_coef: float = 0.0) -> None:
        """``epochs`` x shuffled mini-batches of the core's clipped loss (plus the critic's for PPO)."""
        s = self.s
        settings = LossSettings(eps_low=s.clip, eps_high=s.clip, kl_coef=kl_coef, entropy_coef=s.entropy_coef,
                                aggregation="token_mean")
        m = batch.obs.shape[0]
        params = params or list(self.policy.parameters())
        for _ in range(s.epochs):
            order = torch.randperm(m, generator=self.gen)
            for lo in range(0, m, s.minibatch):
                idx = order[lo:lo + s.minibatch]
                dist = self.policy.dist(batch.obs[idx])
                logp = dist.log_prob(batch.actions[idx])[None]  # [1, m]
                old = batch.old_logp[idx][None]  # [1, m]
                inputs = LossInputs(logp=logp, old_logp=old, advantages=batch.advantages[idx][None],
                                    mask=torch.ones_like(logp), ref_logp=old if kl_coef else None,
                                    entropy=dist.entropy()[None])
                loss = clip_loss(inputs, settings)["loss"]
                if value_coef:
                    v = self.critic(batch.obs[idx])[None]  # [1, m]
                    loss = loss + value_coef * clipped_value_loss(
                        v, batch.old_values[idx][None], batch.returns[idx][None], torch.ones_like(v),
                        clip_range=None)["loss"]
                self.opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, s.max_grad_norm)
                self.opt.step()

    def gae_batch(self, ep: Episodes) -> StepBatch:
        """Values, GAE advantages (whitened) and returns of a batch, flattened."""
        with torch.no_grad():
            values = self.critic(ep.obs) * ep.mask  # [N, T]
        g = gae(ep.rewards, values, ep.mask, gamma=self.s.gamma, lam=self.s.gae_lambda)
        adv = whiten(g["advantages"], ep.mask)  # [N, T]
        return flatten(ep, adv, g["returns"], values)
