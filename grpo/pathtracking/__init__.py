"""GRPO beyond language: steering a car along a path with GRPO, PPO and TRPO (seed 001, 9.2-9.7).

``grpo.pathtracking.env`` is the Gymnasium environment (registered as ``grpo/PathTracking-v0`` on import),
``agents`` the three algorithms on grpo.core's advantage and loss functions, ``compare`` the benchmark
against Stable-Baselines3 PPO and sb3-contrib TRPO. Needs the ``control`` extra (gymnasium).
"""

from grpo.pathtracking.env import PathTrackingEnv, register

register()

__all__ = ["PathTrackingEnv", "register"]
