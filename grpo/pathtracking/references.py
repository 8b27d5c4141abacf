"""The reference implementations on the same environment: Stable-Baselines3 PPO and sb3-contrib TRPO.

Both run with their libraries' default hyper-parameters and default MlpPolicy (64-64 tanh bodies for
the policy and the value function), on 8 copies of the environment stepped in order by a DummyVecEnv
(8 x 256 steps = the default 2048-step rollout). Only the environment-step budget and the seed are
ours. A wrapper counts their steps and records each episode's return in the same ``StepCounter`` our
agents use, so the learning curves and step counts are measured identically.
"""

from __future__ import annotations

from typing import Callable

import gymnasium as gym
import numpy as np
import torch

from grpo.pathtracking.env import PathTrackingEnv
from grpo.pathtracking.rollout import StepCounter
from grpo.registry import Registry

N_ENVS = 8


def _sb3_ppo():
    """Stable-Baselines3 PPO (Raffin et al. 2021) with its default MlpPolicy."""
    from stable_baselines3 import PPO

    return PPO


def _sb3_trpo():
    """sb3-contrib TRPO with its default MlpPolicy."""
    from sb3_contrib import TRPO

    return TRPO


# name -> the SB3 algorithm class (imported when used: SB3 comes with the optional extra)
REFERENCES: Registry[Callable[[], type]] = Registry("reference algorithm", field="--algos")
REFERENCES.register("sb3_ppo", _sb3_ppo)
REFERENCES.register("sb3_trpo", _sb3_trpo)


class _Counting(gym.Wrapper):
    """Adds every step to the shared counter and each finished episode's return to its curve."""

    def __init__(self, env: gym.Env, counter: StepCounter):
        super().__init__(env)
        self.counter, self.ret = counter, 0.0

    def reset(self, **kw):
        self.ret = 0.0
        return self.env.reset(**kw)

    def step(self, action):
        obs, r, term, trunc, info = self.env.step(action)
        self.counter.steps += 1
        self.ret += r
        if term or trunc:
            self.counter.curve.append((self.counter.steps, self.ret))
        return obs, r, term, trunc, info


def train_reference(name: str, *, seed: int, env_steps: int, counter: StepCounter):
    """Train SB3 PPO (``sb3_ppo``) or sb3-contrib TRPO (``sb3_trpo``) for ``env_steps`` steps; the model."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    def make(i: int):
        def thunk():
            env = _Counting(PathTrackingEnv(), counter)
            env.reset(seed=seed * 1000 + i)
            return env
        return thunk

    venv = DummyVecEnv([make(i) for i in range(N_ENVS)])
    venv.seed(seed)
    cls = REFERENCES[name]()
    model = cls("MlpPolicy", venv, n_steps=2048 // N_ENVS, seed=seed, device="cpu", verbose=0)
    model.learn(total_timesteps=env_steps)
    return model


def reference_controller(model):
    """A run_episodes controller of an SB3 model: its deterministic (most likely) action."""

    def act(obs: torch.Tensor):
        a, _ = model.predict(obs.numpy(), deterministic=True)
        a = torch.as_tensor(np.asarray(a), dtype=torch.long).reshape(-1)
        return a, torch.zeros(a.shape)

    return act


def reference_params(model) -> tuple[int, int]:
    """(policy parameters, value parameters) of an SB3 actor-critic with separate bodies."""
    pol = model.policy
    count = lambda mods: sum(p.numel() for m in mods for p in m.parameters())  # noqa: E731
    return (count([pol.mlp_extractor.policy_net, pol.action_net]),
            count([pol.mlp_extractor.value_net, pol.value_net]))
