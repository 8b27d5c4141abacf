"""The step's knobs (epsilon, eps_high, beta, entropy_coef, temperature), the controllers that move
them between steps, and the fuse (a circuit breaker on one metric). Dynamic sampling is in
train/collect.py, reward shaping in train/batch.py, the consistency probe in eval/consistency.py.

Controllers have ``update(metrics) -> value`` and ``state_dict``/``load_state_dict``; ``Knobs`` holds
them and is saved in every checkpoint, so a resumed run continues with the exact knob values it had.
"""

from __future__ import annotations

import math


class BandController:
    """Hold ``metric`` inside [low, high] by moving a knob multiplicatively between bounds.

    Each step, with mid = (low + high) / 2 and half = (high - low) / 2, the knob is multiplied by
    factor ** clamp(direction * (mid - x) / half, -2, 2): proportional control in log space toward the
    band's middle (gentle inside the band, up to factor**2 per step far outside it). direction +1: the
    metric grows with the knob (temperature or entropy_coef -> entropy); -1: it shrinks as the knob
    grows (epsilon -> clip fraction).

    ``hold_inside``: the knob moves only while the metric is outside the band. For a knob that acts
    through the weights a step or more late (entropy_coef), proportional drift inside the band shrinks
    it by orders of magnitude while entropy sits in the upper half, and it is then far too small when
    entropy starts to fall; holding it still inside the band avoids that.
    """

    def __init__(self, *, metric: str, low: float, high: float, value: float, factor: float, bounds: tuple,
                 direction: int, hold_inside: bool = False):
        self.metric, self.low, self.high = metric, low, high
        self.value, self.factor, self.bounds, self.direction = value, factor, bounds, direction
        self.hold_inside = hold_inside

    def update(self, metrics: dict) -> float:
        x = metrics.get(self.metric)
        inside = isinstance(x, (int, float)) and self.low <= x <= self.high
        if isinstance(x, (int, float)) and math.isfinite(x) and not (self.hold_inside and inside):
            mid, half = (self.low + self.high) / 2, (self.high - self.low) / 2
            err = min(max(self.direction * (mid - x) / half, -2.0), 2.0)
            self.value = min(max(self.value * self.factor ** err, self.bounds[0]), self.bounds[1])
        return self.value

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


class AdaptiveKL:
    """Ziegler et al. 2019 ("Fine-Tuning Language Models from Human Preferences", section 2.2):
    beta <- beta * (1 + K_beta * clip(KL / KL_target - 1, -0.2, 0.2)), one update per step."""

    def __init__(self, *, beta: float, target: float, rate: float):
        self.value, self.target, self.rate = beta, target, rate

    def update(self, metrics: dict) -> float:
        kl = metrics.get("kl")
        if isinstance(kl, (int, float)) and math.isfinite(kl):
            err = min(max(kl / self.target - 1.0, -0.2), 0.2)
            self.value *= 1.0 + self.rate * err
        return self.value

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


class Fuse:
    """Blow when ``metric`` lies outside [low, high] (or is not finite) for ``patience`` steps in a row.
    A step that does not log the metric (consistency_cv comes every consistency_steps) neither strikes
    nor resets; one that has not appeared in the first ``grace`` steps is no metric of this run, and
    blows the fuse with the list of those there are (the run stops with a checkpoint, not a traceback)."""

    def __init__(self, *, metric: str, low: float, high: float, patience: int, grace: int = 1):
        self.metric, self.low, self.high, self.patience, self.grace = metric, low, high, patience, grace
        self.strikes, self.seen, self.missing = 0, False, 0

    def update(self, metrics: dict) -> str | None:
        """The reason to stop, or None."""
        x = metrics.get(self.metric)
        if x is None:
            self.missing += not self.seen
            if self.seen or self.missing < self.grace:
                return None
            return (f"fuse_metric: {self.metric!r} was not logged in {self.missing} steps; the metrics this run "
                    f"logs are {sorted(k for k, v in metrics.items() if isinstance(v, (int, float)))}")
        self.seen = True
        outside = not (isinstance(x, (int, float)) and math.isfinite(x) and self.low <= x <= self.high)
        self.strikes = self.strikes + 1 if outside else 0
        if self.strikes >= self.patience:
            return (f"fuse: {self.metric} = {x} left its band [{self.low}, {self.high}] for {self.strikes} "
                    f"consecutive steps")
        return None

    def state_dict(self) -> dict:
        return {"strikes": self.strikes, "seen": self.seen, "missing": self.missing}

    def load_state_dict(self, state: dict) -> None:
        self.strikes = state["strikes"]
        self.seen, self.missing = state.get("seen", True), state.get("missing", 0)  # older checkpoints: none


class Knobs:
    """The step's knobs (epsilon, eps_high, beta, entropy_coef, temperature) and the tools that move them."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.epsilon, self.eps_high, self.beta = cfg.epsilon, cfg.eps_high, cfg.beta
        self.entropy_coef, self.temperature = cfg.entropy_coef, cfg.temperature
        self.controllers: dict = {}
        if cfg.clip_target_band is not None:  # wider eps -> fewer clipped tokens: direction -1
            lo, hi = cfg.clip_target_band
            self.controllers["epsilon"] = BandController(
                metric="clip_fraction", low=lo, high=hi, value=cfg.epsilon, factor=cfg.controller_factor,
                bounds=(cfg.clip_epsilon_min, cfg.clip_epsilon_max), direction=-1)
        if cfg.entropy_target_band is not None:
            lo, hi = cfg.entropy_target_band
            knob = cfg.entropy_target_knob
            start = cfg.temperature if knob == "temperature" else max(cfg.entropy_coef, 1e-4)
            bounds = (0.05, 4.0) if knob == "temperature" else (1e-4, 10.0)
            self.controllers[knob] = BandController(metric="entropy", low=lo, high=hi, value=start,
                                                    factor=cfg.controller_factor, bounds=bounds, direction=1,
                                                    hold_inside=knob == "entropy_coef")
        if cfg.kl_target is not None:
            self.controllers["beta"] = AdaptiveKL(beta=cfg.beta, target=cfg.kl_target, rate=cfg.kl_adapt_rate)
        self.fuse = None
        if cfg.fuse_metric:
            self.fuse = Fuse(metric=cfg.fuse_metric, low=-math.inf if cfg.fuse_min is None else cfg.fuse_min,
                             high=math.inf if cfg.fuse_max is None else cfg.fuse_max, patience=cfg.fuse_patience,
                             grace=max(1, cfg.consistency_steps))
        self._apply()

    def _apply(self) -> None:
        for knob, ctl in self.controllers.items():
            setattr(self, knob, ctl.value)
        if "epsilon" in self.controllers:  # clip-higher keeps its ratio to the lower range
            self.eps_high = self.epsilon * self.cfg.eps_high / max(self.cfg.epsilon, 1e-12)

    def values(self) -> dict:
        """The values this step trains with, logged as metrics."""
        return {"epsilon": self.epsilon, "epsilon_high": self.eps_high, "beta": self.beta,
                "entropy_coef": self.entropy_coef, "temperature": self.temperature}

    def after_step(self, metrics: dict) -> str | None:
        """Add the non-finite count, move every controller, and return the fuse's reason to stop (or None)."""
        metrics["nonfinite_count"] = sum(1 for v in metrics.values()
                                         if isinstance(v, float) and not math.isfinite(v))
        for ctl in self.controllers.values():
            ctl.update(metrics)
        self._apply()
        return self.fuse.update(metrics) if self.fuse is not None else None

    def state_dict(self) -> dict:
        state = {k: c.state_dict() for k, c in self.controllers.items()}
        if self.fuse is not None:
            state["fuse"] = self.fuse.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        for k, c in self.controllers.items():
            c.load_state_dict(state[k])
        if self.fuse is not None:
            self.fuse.load_state_dict(state["fuse"])
        self._apply()
