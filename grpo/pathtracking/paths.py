"""Reference paths for the path-tracking environment and the scenarios (path + start pose) it runs.

Every path starts at the origin heading along +x and is stored as points a fixed arc length ``DS``
apart, so the lateral error and progress come from a local search on one segment. Four families
(seed 001, section 9): straight, constant curvature, sine, lane change. Their parameters are bounded so that the
path's curvature stays below the car's largest steering curvature (tan 24 deg / 2.5 m = 0.18 1/m),
that is every path can be tracked exactly by some sequence of the preset angles.

Training draws random scenarios from a seeded generator (``random_scenario``); evaluation uses the
fixed ``held_out_scenarios`` (parameters no training draw uses exactly, and fixed start offsets).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from grpo.errors import ConfigError

DS = 0.2  # m between stored path points
PATH_LENGTH = 50.0  # m of every path: 100 steps at 5 m/s and dt 0.1 s
FAMILIES = ("straight", "arc", "sine", "lane_change")
START_LATERAL = 1.0  # m: training starts uniformly within +-1 m of the path
START_HEADING = 0.3  # rad: and within +-0.3 rad of its heading


@dataclass(frozen=True)
class ReferencePath:
    """A path as points DS apart: x, y (m) and the heading of each segment (rad, len(x) - 1 entries)."""

    family: str
    x: tuple[float, ...]
    y: tuple[float, ...]
    heading: tuple[float, ...]

    @property
    def length(self) -> float:
        return (len(self.x) - 1) * DS


@dataclass(frozen=True)
class Scenario:
    """One episode's setting: the path and the car's start offset from its first point."""

    path: ReferencePath
    lateral: float  # m, positive left of the path
    heading: float  # rad, the car's heading minus the path's


def _resample(xs: np.ndarray, ys: np.ndarray, family: str) -> ReferencePath:
    """A dense polyline -> points DS apart along its arc length, cut at PATH_LENGTH."""
    seg = np.hypot(np.diff(xs), np.diff(ys))
    s = np.concatenate([[0.0], np.cumsum(seg)])
    if s[-1] < PATH_LENGTH:
        raise ValueError(f"{family}: the dense polyline is {s[-1]:.1f} m, shorter than {PATH_LENGTH} m")
    grid = np.arange(0.0, PATH_LENGTH + 1e-9, DS)
    x, y = np.interp(grid, s, xs), np.interp(grid, s, ys)
    heading = np.arctan2(np.diff(y), np.diff(x))
    return ReferencePath(family, tuple(map(float, x)), tuple(map(float, y)), tuple(map(float, heading)))


def make_path(family: str, **params: float) -> ReferencePath:
    """Build one path of a family.

    straight: no parameters. arc: ``curvature`` (1/m, sign = turning left). sine: y = ``amplitude`` *
    sin(2 pi x / ``wavelength``). lane_change: y goes from 0 to ``width`` as a half cosine over
    ``change_length`` m starting at x = ``start``.
    """
    x = np.linspace(0.0, 2 * PATH_LENGTH, 1001)  # 0.1 m apart
    if family == "straight":
        return _resample(x, np.zeros_like(x), family)
    if family == "arc":
        k = params["curvature"]
        s = np.linspace(0.0, 1.5 * PATH_LENGTH, 751)
        if abs(k) < 1e-9:
            return _resample(s, np.zeros_like(s), family)
        return _resample(np.sin(k * s) / k, (1.0 - np.cos(k * s)) / k, family)
    if family == "sine":
        return _resample(x, params["amplitude"] * np.sin(2 * np.pi * x / params["wavelength"]), family)
    if family == "lane_change":
        u = np.clip((x - params["start"]) / params["change_length"], 0.0, 1.0)
        return _resample(x, params["width"] * 0.5 * (1.0 - np.cos(np.pi * u)), family)
    raise ConfigError(f"unknown path family {family!r}; valid: {list(FAMILIES)}")


def random_path(rng: np.random.Generator) -> ReferencePath:
    """A path of a uniformly drawn family with uniformly drawn parameters (the training distribution)."""
    family = FAMILIES[int(rng.integers(len(FAMILIES)))]
    sign = 1.0 if rng.random() < 0.5 else -1.0
    if family == "arc":
        return make_path(family, curvature=sign * rng.uniform(0.02, 0.08))
    if family == "sine":
        return make_path(family, amplitude=sign * rng.uniform(0.5, 2.0), wavelength=rng.uniform(25.0, 45.0))
    if family == "lane_change":
        return make_path(family, width=sign * rng.uniform(2.5, 3.5), change_length=rng.uniform(15.0, 25.0),
                         start=rng.uniform(5.0, 15.0))
    return make_path(family)


def random_scenario(rng: np.random.Generator) -> Scenario:
    """A random path and a start offset within +-START_LATERAL m and +-START_HEADING rad."""
    path = random_path(rng)
    return Scenario(path, float(rng.uniform(-START_LATERAL, START_LATERAL)),
                    float(rng.uniform(-START_HEADING, START_HEADING)))


_HELD_OUT = (
    ("straight", {}, 0.8, -0.2),
    ("straight", {}, -0.5, 0.3),
    ("arc", {"curvature": 0.05}, -0.6, 0.1),
    ("arc", {"curvature": -0.07}, 0.4, -0.25),
    ("sine", {"amplitude": 1.5, "wavelength": 32.0}, 0.0, 0.0),
    ("sine", {"amplitude": -1.0, "wavelength": 27.0}, 0.7, 0.15),
    ("lane_change", {"width": 3.0, "change_length": 18.0, "start": 8.0}, 0.0, 0.0),
    ("lane_change", {"width": -3.2, "change_length": 22.0, "start": 12.0}, -0.9, -0.1),
)


def held_out_scenarios() -> list[Scenario]:
    """The eight fixed evaluation scenarios: two per family, with fixed start offsets."""
    return [Scenario(make_path(f, **p), lat, head) for f, p, lat, head in _HELD_OUT]


def max_curvature(path: ReferencePath) -> float:
    """Largest |heading change| / DS over the path (1/m), a check that the car can follow it."""
    h = np.unwrap(np.asarray(path.heading))
    return float(np.abs(np.diff(h)).max() / DS) if len(h) > 1 else 0.0


def wrap_angle(a: float) -> float:
    """An angle in (-pi, pi]."""
    return math.atan2(math.sin(a), math.cos(a))
