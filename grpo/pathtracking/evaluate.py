"""Held-out evaluation of a controller, and the proportional steering baseline.

A controller is anything ``run_episodes`` accepts: obs [M, 2] -> (actions [M], logp [M]). Evaluation
is greedy (a policy's most likely action) on ``held_out_scenarios``: mean return, RMS lateral error
over every step driven, and the share of scenarios that reach the path's end inside the band.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from grpo.pathtracking.env import BAND, HEADING_SCALE, STEER_RAD, PathTrackingEnv
from grpo.pathtracking.paths import Scenario, held_out_scenarios, random_scenario
from grpo.pathtracking.rollout import Episodes, run_episodes


@dataclass
class EvalResult:
    mean_return: float
    rms_lateral: float  # m, over every step of every held-out episode
    completion: float  # share of scenarios finished inside the band
    episodes: Episodes


def evaluate(controller, scenarios: list[Scenario] | None = None) -> EvalResult:
    """Run the controller once on each scenario (default: the held-out ones)."""
    scenarios = held_out_scenarios() if scenarios is None else scenarios
    ep = run_episodes(controller, [PathTrackingEnv() for _ in scenarios], scenarios)
    lat = ep.lateral[ep.mask.bool()]
    return EvalResult(float(ep.returns.mean()), float(lat.pow(2).mean().sqrt()), float(ep.completed.float().mean()),
                      ep)


def proportional_controller(k_lateral: float, k_heading: float):
    """delta = -(k_lateral e + k_heading e_psi), rounded to the nearest preset angle (gains in rad/m, rad/rad)."""
    angles = torch.tensor(STEER_RAD)  # [A]

    def act(obs: Tensor):
        e, epsi = obs[:, 0] * BAND, obs[:, 1] * HEADING_SCALE  # [M] metres, radians
        delta = -(k_lateral * e + k_heading * epsi)  # [M]
        a = (delta[:, None] - angles[None]).abs().argmin(1)  # [M]
        return a, torch.zeros(a.shape)

    return act


@dataclass
class Gains:
    k_lateral: float
    k_heading: float
    train_return: float


def tune_proportional(*, seed: int = 0, n_scenarios: int = 16) -> Gains:
    """The best gains of a grid on random training scenarios (never the held-out ones), by mean return."""
    rng = np.random.default_rng(10_000 + seed)
    scen = [random_scenario(rng) for _ in range(n_scenarios)]
    best = None
    for kl in (0.5, 1.0, 2.0, 4.0, 8.0):
        for kh in (1.0, 2.0, 4.0, 8.0, 16.0):
            r = evaluate(proportional_controller(kl, kh), scen).mean_return
            if best is None or r > best.train_return:
                best = Gains(kl, kh, r)
    return best
