"""The step's knobs (epsilon, eps_high, beta, entropy_coef, temperature), the controllers that move
them between steps, and the fuse (a circuit breaker on one metric). Dynamic sampling is in
train/collect.py, reward shaping in train/batch.py, the consistency probe in eval/probe.py.

Controllers have ``update(metrics) -> value`` and ``state_dict``/``load_state_dict``; ``Knobs`` holds
them and is saved in every checkpoint, so a resumed run continues with the exact knob values it had.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


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


class StepController:
    """Seed 003 section 3.4's additive clip control: after ``patience`` consecutive steps with ``metric``
    below ``low`` the knob moves by ``-direction * step``, above ``high`` by ``+direction * step``,
    within ``bounds``; the count restarts after each move and whenever the metric is inside the band.
    For epsilon and the clip fraction, direction +1: too few clipped tokens -> a narrower range (seed
    003: "TLCR < 25% means epsilon is too large"), too many -> a wider one. ``state`` and ``strikes``
    are logged (as ``<metric>_state``, ``<metric>_strikes``)."""

    def __init__(self, *, metric: str, low: float, high: float, value: float, step: float, patience: int,
                 bounds: tuple, direction: int = 1):
        self.metric, self.low, self.high, self.value = metric, low, high, value
        self.step, self.patience, self.bounds, self.direction = step, patience, bounds, direction
        self.strikes, self.side, self.state = 0, 0, "inside"

    def update(self, metrics: dict) -> float:
        x = metrics.get(self.metric)
        if not (isinstance(x, (int, float)) and math.isfinite(x)):
            return self.value
        side = -1 if x < self.low else 1 if x > self.high else 0
        self.strikes = self.strikes + 1 if side and side == self.side else int(bool(side))
        self.side, self.state = side, ("below", "inside", "above")[side + 1]
        if side and self.strikes >= self.patience:
            self.value = min(max(self.value + side * self.direction * self.step, self.bounds[0]), self.bounds[1])
            self.strikes = 0
        return self.value

    def report(self) -> dict:
        return {f"{self.metric}_state": self.state, f"{self.metric}_strikes": self.strikes}

    def state_dict(self) -> dict:
        return {"value": self.value, "strikes": self.strikes, "side": self.side, "state": self.state}

    def load_state_dict(self, state: dict) -> None:
        self.value, self.strikes = state["value"], state["strikes"]
        self.side, self.state = state["side"], state["state"]


class ConsistencyWatch:
    """Seed 003 section 3.4's reading of the consistency probe (CGC, the coefficient of variation of a
    prompt's rewards): 'converging' below ``converging``, 'guessing' above ``guessing``, else
    'between'; and the first step at which it fell below ``plateau`` (the seed: accuracy tops out
    about 2000 steps later). Steps without a probe report the last state."""

    def __init__(self, *, converging: float, guessing: float, plateau: float, metric: str = "consistency_cv"):
        self.converging, self.guessing, self.plateau, self.metric = converging, guessing, plateau, metric
        self.steps, self.state, self.plateau_step = 0, "unprobed", None

    def update(self, metrics: dict) -> dict:
        self.steps += 1
        x = metrics.get(self.metric)
        if isinstance(x, (int, float)) and math.isfinite(x):
            self.state = "converging" if x < self.converging else "guessing" if x > self.guessing else "between"
            if self.plateau_step is None and x < self.plateau:
                self.plateau_step = self.steps
        return {"consistency_state": self.state, "consistency_plateau_step": self.plateau_step}

    def state_dict(self) -> dict:
        return {"steps": self.steps, "state": self.state, "plateau_step": self.plateau_step}

    def load_state_dict(self, state: dict) -> None:
        self.steps, self.state, self.plateau_step = state["steps"], state["state"], state["plateau_step"]


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


@dataclass(frozen=True)
class KnobSettings:
    """What the knobs start from and what moves them. Each field is the Config field of the same name
    (its docstring in grpo/config/fields.py says more); a band of None switches its controller off."""

    epsilon: float  # lower clip range of the ratio
    eps_high: float  # upper clip range (clip-higher keeps its ratio to epsilon when a controller moves it)
    beta: float  # KL coefficient
    entropy_coef: float  # weight of the entropy bonus
    temperature: float  # sampling temperature (and of the loss's log-probs)
    clip_target_band: tuple[float, float] | None  # band controller: clip fraction in [low, high] by epsilon
    clip_step_band: tuple[float, float] | None  # additive clip control (seed 003 section 3.4)
    clip_step_size: float  # how far one additive move takes epsilon
    clip_step_patience: int  # steps outside clip_step_band before epsilon moves
    clip_epsilon_min: float  # smallest epsilon either clip controller sets
    clip_epsilon_max: float  # largest epsilon either clip controller sets
    controller_factor: float  # band controllers' multiplicative step
    entropy_target_band: tuple[float, float] | None  # entropy in [low, high] by entropy_target_knob
    entropy_target_knob: str  # temperature or entropy_coef
    kl_target: float | None  # adaptive KL (Ziegler et al. 2019): beta moves toward this KL
    kl_adapt_rate: float  # its proportional gain
    consistency_steps: int  # the consistency probe's period (0: off, no watch)
    consistency_converging: float  # the probe reads 'converging' below this coefficient of variation
    consistency_guessing: float  # and 'guessing' above this one
    consistency_plateau: float  # the first probe below this is the plateau step
    fuse_metric: str  # the fuse's metric ('': no fuse)
    fuse_min: float | None  # its band's lower edge (None: none)
    fuse_max: float | None  # its band's upper edge (None: none)
    fuse_patience: int  # consecutive steps outside the band that blow it


@dataclass(frozen=True)
class AfterStep:
    """What the knobs' controllers and fuse made of a step: the metrics they add, and the fuse's reason
    to stop (None: go on)."""

    metrics: dict
    fuse_reason: str | None


class Knobs:
    """The step's knobs (epsilon, eps_high, beta, entropy_coef, temperature) and the tools that move them."""

    def __init__(self, settings: KnobSettings):
        s = self.settings = settings
        self.epsilon, self.eps_high, self.beta = s.epsilon, s.eps_high, s.beta
        self.entropy_coef, self.temperature = s.entropy_coef, s.temperature
        self.controllers: dict = {}
        if s.clip_target_band is not None:  # wider eps -> fewer clipped tokens: direction -1
            lo, hi = s.clip_target_band
            self.controllers["epsilon"] = BandController(
                metric="clip_fraction", low=lo, high=hi, value=s.epsilon, factor=s.controller_factor,
                bounds=(s.clip_epsilon_min, s.clip_epsilon_max), direction=-1)
        if s.clip_step_band is not None:  # seed 003 section 3.4
            lo, hi = s.clip_step_band
            self.controllers["epsilon"] = StepController(
                metric="clip_fraction", low=lo, high=hi, value=s.epsilon, step=s.clip_step_size,
                patience=s.clip_step_patience, bounds=(s.clip_epsilon_min, s.clip_epsilon_max))
        if s.entropy_target_band is not None:
            lo, hi = s.entropy_target_band
            knob = s.entropy_target_knob
            start = s.temperature if knob == "temperature" else max(s.entropy_coef, 1e-4)
            bounds = (0.05, 4.0) if knob == "temperature" else (1e-4, 10.0)
            self.controllers[knob] = BandController(metric="entropy", low=lo, high=hi, value=start,
                                                    factor=s.controller_factor, bounds=bounds, direction=1,
                                                    hold_inside=knob == "entropy_coef")
        if s.kl_target is not None:
            self.controllers["beta"] = AdaptiveKL(beta=s.beta, target=s.kl_target, rate=s.kl_adapt_rate)
        self.watch = None
        if s.consistency_steps:
            self.watch = ConsistencyWatch(converging=s.consistency_converging, guessing=s.consistency_guessing,
                                          plateau=s.consistency_plateau)
        self.fuse = None
        if s.fuse_metric:
            self.fuse = Fuse(metric=s.fuse_metric, low=-math.inf if s.fuse_min is None else s.fuse_min,
                             high=math.inf if s.fuse_max is None else s.fuse_max, patience=s.fuse_patience,
                             grace=max(1, s.consistency_steps))
        self._apply()

    def _apply(self) -> None:
        for knob, ctl in self.controllers.items():
            setattr(self, knob, ctl.value)
        if "epsilon" in self.controllers:  # clip-higher keeps its ratio to the lower range
            self.eps_high = self.epsilon * self.settings.eps_high / max(self.settings.epsilon, 1e-12)

    def values(self) -> dict:
        """The values this step trains with, logged as metrics."""
        return {"epsilon": self.epsilon, "epsilon_high": self.eps_high, "beta": self.beta,
                "entropy_coef": self.entropy_coef, "temperature": self.temperature}

    def after_step(self, metrics: dict) -> AfterStep:
        """Move every controller on the step's ``metrics`` (left as they are) and the fuse: what they add
        to the step's metrics line (the non-finite count, the monitors' reports, the fuse's strikes) and
        the fuse's reason to stop (or None)."""
        added = {"nonfinite_count": sum(1 for v in metrics.values() if isinstance(v, float) and not math.isfinite(v))}
        seen = {**metrics, **added}
        for ctl in self.controllers.values():
            ctl.update(seen)
        self._apply()
        report = self.report(seen)
        added.update(report)
        seen.update(report)
        reason = self.fuse.update(seen) if self.fuse is not None else None
        if self.fuse is not None:
            added["fuse_strikes"] = self.fuse.strikes
        return AfterStep(added, reason)

    def report(self, metrics: dict) -> dict:
        """The states the monitors report this step (the additive clip controller's side and count,
        the consistency probe's reading), logged with the step's metrics."""
        out = {}
        for ctl in self.controllers.values():
            if hasattr(ctl, "report"):
                out.update(ctl.report())
        if self.watch is not None:
            out.update(self.watch.update(metrics))
        return out

    def state_dict(self) -> dict:
        state = {k: c.state_dict() for k, c in self.controllers.items()}
        if self.fuse is not None:
            state["fuse"] = self.fuse.state_dict()
        if self.watch is not None:
            state["consistency_watch"] = self.watch.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        for k, c in self.controllers.items():
            c.load_state_dict(state[k])
        if self.fuse is not None:
            self.fuse.load_state_dict(state["fuse"])
        if self.watch is not None and "consistency_watch" in state:  # older checkpoints: none
            self.watch.load_state_dict(state["consistency_watch"])
        self._apply()
