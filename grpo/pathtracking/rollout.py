"""Run whole episodes of many environments in lockstep, one batched policy forward per step.

Dimension letters: N episodes, T steps (the longest episode of the batch), D observation size.
Episodes end by termination (left the band, reached the path's end) or, rarely, by the step limit;
every tensor is padded to T with mask 0 after an episode's last step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from grpo.pathtracking.env import PathTrackingEnv
from grpo.pathtracking.paths import Scenario


@dataclass
class Episodes:
    """A batch of finished episodes, padded to the longest."""

    obs: Tensor  # [N, T, D] the observation each action was taken in
    actions: Tensor  # [N, T] long
    logp: Tensor  # [N, T] log pi(action) at sampling time (0 for a greedy or scripted controller)
    rewards: Tensor  # [N, T]
    mask: Tensor  # [N, T] 1 on steps taken
    lateral: Tensor  # [N, T] lateral error after each step (m)
    completed: Tensor  # [N] bool: reached the path's end inside the band
    end_steps: list[int] = field(default_factory=list)  # env-step counter when each episode ended

    @property
    def returns(self) -> Tensor:
        return (self.rewards * self.mask).sum(1)  # [N]

    @property
    def n_steps(self) -> int:
        return int(self.mask.sum())


@dataclass
class StepCounter:
    """Environment steps taken so far, and (steps, return) of every finished training episode."""

    steps: int = 0
    curve: list[tuple[int, float]] = field(default_factory=list)


def run_episodes(controller, envs: list[PathTrackingEnv], scenarios: list[Scenario], *,
                 counter: StepCounter | None = None) -> Episodes:
    """One episode per scenario (envs[i] runs scenarios[i]), stepped in lockstep.

    ``controller(obs [M, D] float tensor) -> (actions [M] long, logp [M])`` acts for the M episodes
    still running. The counter, if given, adds each step taken in lockstep order (as a vectorised env
    does) and records each episode's return when it ends.
    """
    n = len(scenarios)
    obs_now = [envs[i].reset(options={"scenario": scenarios[i]})[0] for i in range(n)]
    buf = {k: [[] for _ in range(n)] for k in ("obs", "act", "logp", "rew", "lat")}
    completed, end_steps = [False] * n, [0] * n
    active = list(range(n))
    while active:
        obs = torch.as_tensor(np.stack([obs_now[i] for i in active]))  # [M, D]
        actions, logp = controller(obs)  # [M], [M]
        still = []
        for j, i in enumerate(active):
            a = int(actions[j])
            o, r, term, trunc, info = envs[i].step(a)
            for k, v in (("obs", obs[j]), ("act", a), ("logp", float(logp[j])), ("rew", r),
                         ("lat", info["lateral_error"])):
                buf[k][i].append(v)
            obs_now[i] = o
            if counter is not None:
                counter.steps += 1
            if term or trunc:
                completed[i] = info["completed"]
                end_steps[i] = counter.steps if counter is not None else 0
                if counter is not None:
                    counter.curve.append((counter.steps, float(sum(buf["rew"][i]))))
            else:
                still.append(i)
        active = still
    return _pad(buf, completed, end_steps, obs_dim=envs[0].observation_space.shape[0])


def _pad(buf: dict, completed: list[bool], end_steps: list[int], *, obs_dim: int) -> Episodes:
    """Per-episode lists -> padded [N, T] tensors."""
    n = len(completed)
    t = max(len(a) for a in buf["act"])
    obs = torch.zeros(n, t, obs_dim)  # [N, T, D]
    actions = torch.zeros(n, t, dtype=torch.long)  # [N, T]
    logp, rewards, mask, lateral = (torch.zeros(n, t) for _ in range(4))  # [N, T] each
    for i in range(n):
        k = len(buf["act"][i])
        obs[i, :k] = torch.stack(buf["obs"][i])
        actions[i, :k] = torch.tensor(buf["act"][i])
        logp[i, :k] = torch.tensor(buf["logp"][i])
        rewards[i, :k] = torch.tensor(buf["rew"][i])
        lateral[i, :k] = torch.tensor(buf["lat"][i])
        mask[i, :k] = 1.0
    return Episodes(obs, actions, logp, rewards, mask, lateral, torch.tensor(completed), end_steps)


def policy_controller(policy, *, greedy: bool = False, generator: torch.Generator | None = None):
    """A run_episodes controller of a PolicyNet: sampled actions and their log-probs (greedy: argmax)."""

    @torch.no_grad()
    def act(obs: Tensor):
        logits = policy(obs)  # [M, A]
        logp_all = torch.log_softmax(logits, -1)  # [M, A]
        if greedy:
            a = logits.argmax(-1)  # [M]
        else:
            a = torch.multinomial(logp_all.exp(), 1, generator=generator)[:, 0]  # [M]
        return a, logp_all.gather(1, a[:, None])[:, 0]

    return act
