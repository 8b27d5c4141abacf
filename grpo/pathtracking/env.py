"""``grpo/PathTracking-v0``: steer a car along a reference path (seed 001, sections 9.2 and 9.7).

Vehicle: a kinematic bicycle model about the rear axle at a constant speed, integrated with explicit
Euler steps (``bicycle_step``):

    x' = x + v cos(psi) dt,   y' = y + v sin(psi) dt,   psi' = psi + v / L tan(delta) dt

with v = SPEED = 5 m/s, wheelbase L = WHEELBASE = 2.5 m, dt = DT = 0.1 s (0.5 m per step).

Actions: the seed's 17 preset steering angles, delta in STEER_DEG = -24, -21, ..., 24 degrees.

State: the seed's 2-D normalised state, (lateral error / BAND, heading error / (pi / 2)), each
clipped to [-1, 1]. The lateral error is the signed distance to the path (positive left of it), the
heading error the car's heading minus the path's (wrapped to (-pi, pi]).

Reward per step (seed: on-line reward + heading alignment - steering penalty):

    r = W_LINE (1 - |e| / BAND) + W_HEADING cos(e_psi) - W_STEER (delta / delta_max)^2

with W_LINE = 0.6, W_HEADING = 0.4, W_STEER = 0.1, so a step on the line, aligned and steering
straight earns 1. Every in-band step earns more than -W_STEER, hence leaving the band forfeits the
rest of the path's reward; there is no extra penalty.

Termination: |e| > BAND = 2 m (left the lane) or the car's progress reaches the path's end (every
path is 50 m: about 100 steps); truncation after MAX_STEPS = 200 steps (a car that stops progressing).
``reset(options={"scenario": Scenario})`` starts a given path and start offset (GRPO's groups run
one scenario G times); without it the env draws a training scenario from its own generator.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np

from grpo.pathtracking.paths import DS, ReferencePath, Scenario, random_scenario, wrap_angle

SPEED = 5.0  # m/s
WHEELBASE = 2.5  # m
DT = 0.1  # s
STEER_DEG = tuple(range(-24, 25, 3))  # the 17 preset steering angles
STEER_RAD = tuple(math.radians(d) for d in STEER_DEG)
BAND = 2.0  # m: the lateral band; outside it the episode ends
W_LINE, W_HEADING, W_STEER = 0.6, 0.4, 0.1
MAX_STEPS = 200
HEADING_SCALE = math.pi / 2


def bicycle_step(x: float, y: float, psi: float, delta: float, *, v: float = SPEED, wheelbase: float = WHEELBASE,
                 dt: float = DT) -> tuple[float, float, float]:
    """One explicit Euler step of the kinematic bicycle model (rear-axle reference point)."""
    return (x + v * math.cos(psi) * dt, y + v * math.sin(psi) * dt,
            psi + v / wheelbase * math.tan(delta) * dt)


def step_reward(lateral: float, heading: float, delta: float) -> float:
    """The per-step reward (module docstring) of errors lateral (m), heading (rad) and steering delta (rad)."""
    return (W_LINE * (1.0 - abs(lateral) / BAND) + W_HEADING * math.cos(heading)
            - W_STEER * (delta / STEER_RAD[-1]) ** 2)


def project(path: ReferencePath, x: float, y: float, index: int) -> tuple[int, float, float]:
    """(segment index, fraction along it, signed lateral error) of point (x, y), searching from ``index``.

    The car moves 0.5 m a step and segments are DS = 0.2 m, so walking a few segments forward (or back)
    from the previous one finds the segment the point projects onto.
    """
    px, py = path.x, path.y
    last = len(px) - 2
    step = 0  # the search direction once chosen: a point outside a bend projects past the end of one
    while True:  # segment and before the start of the next, and must not bounce between them
        dx, dy = px[index + 1] - px[index], py[index + 1] - py[index]
        rx, ry = x - px[index], y - py[index]
        t = (rx * dx + ry * dy) / (DS * DS)
        if t > 1.0 and index < last and step >= 0:
            index, step = index + 1, 1
        elif t < 0.0 and index > 0 and step <= 0:
            index, step = index - 1, -1
        else:
            return index, t, (dx * ry - dy * rx) / DS


class PathTrackingEnv(gym.Env):
    """The path-tracking task (module docstring): Discrete(17) actions, Box(-1, 1, (2,)) observations."""

    metadata = {"render_modes": []}

    def __init__(self):
        self.action_space = gym.spaces.Discrete(len(STEER_RAD))
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.scenario: Scenario | None = None
        self.trace: list[tuple[float, float]] = []

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        scenario = (options or {}).get("scenario") or random_scenario(self.np_random)
        self.scenario, path = scenario, scenario.path
        # the start pose: offset from the first point along the path's left normal, heading offset
        h0 = path.heading[0]
        self.x = path.x[0] - math.sin(h0) * scenario.lateral
        self.y = path.y[0] + math.cos(h0) * scenario.lateral
        self.psi = h0 + scenario.heading
        self.index, self.steps = 0, 0
        self.index, _, self.lateral = project(path, self.x, self.y, 0)
        self.heading_error = wrap_angle(self.psi - path.heading[self.index])
        self.trace = [(self.x, self.y)]
        return self._obs(), self._info(False)

    def step(self, action):
        if self.scenario is None:
            raise RuntimeError("PathTrackingEnv.step before reset")
        delta = STEER_RAD[int(action)]
        path = self.scenario.path
        self.x, self.y, self.psi = bicycle_step(self.x, self.y, self.psi, delta)
        self.index, t, self.lateral = project(path, self.x, self.y, self.index)
        self.heading_error = wrap_angle(self.psi - path.heading[self.index])
        self.steps += 1
        self.trace.append((self.x, self.y))
        done_path = self.index == len(path.x) - 2 and t >= 1.0
        off = abs(self.lateral) > BAND
        reward = step_reward(self.lateral, self.heading_error, delta)
        terminated = off or done_path
        truncated = not terminated and self.steps >= MAX_STEPS
        return self._obs(), float(reward), terminated, truncated, self._info(done_path and not off)

    def _obs(self) -> np.ndarray:
        o = np.array([self.lateral / BAND, self.heading_error / HEADING_SCALE], dtype=np.float32)
        return np.clip(o, -1.0, 1.0)

    def _info(self, completed: bool) -> dict:
        return {"lateral_error": self.lateral, "heading_error": self.heading_error, "completed": completed}


def register() -> None:
    """Register ``grpo/PathTracking-v0`` with gymnasium (idempotent)."""
    if "grpo/PathTracking-v0" not in gym.registry:
        gym.register(id="grpo/PathTracking-v0", entry_point="grpo.pathtracking.env:PathTrackingEnv")
