"""Stability tools around the GRPO loop: controllers that move a knob between steps, the fuse, dynamic
sampling, the group/sample filters and the consistency probe. The tensor math is in grpo.core.stability;
this module owns the bookkeeping and is the only place the trainer asks for the step's knobs.

Controllers have ``update(metrics) -> value`` and ``state_dict``/``load_state_dict`` and are registered
in ``trainer.stateful`` so a resumed run continues with the exact knob values it had.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from grpo import core
from grpo import distributed as dist_io
from grpo.data import render_prompt
from grpo.rollout import Rollout, generate_rollout


class FuseError(RuntimeError):
    """The fuse stopped the run; the message names the metric, its band and the checkpoint."""


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


class Stability:
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

    def knobs(self) -> dict:
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


# ---- rollouts: select groups, concatenate rounds ---------------------------------------------------

def select_rollout(ro: Rollout, idx: torch.Tensor) -> Rollout:
    """The sequences ``idx`` [n] of a rollout, in that order."""
    il = idx.tolist()
    return Rollout(ro.prompt_ids[idx], ro.prompt_mask[idx], ro.completion_ids[idx], ro.completion_mask[idx],
                   ro.truncated[idx], None if ro.sampling_logp is None else ro.sampling_logp[idx],
                   [ro.texts[i] for i in il], ro.backend, ro.seconds)


def concat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """Rollouts of several sampling rounds as one: prompts left-padded, completions right-padded."""
    if len(parts) == 1:
        return parts[0]
    p = max(r.prompt_ids.shape[1] for r in parts)
    t = max(r.completion_ids.shape[1] for r in parts)

    def left(x, width, value):  # [n, w] -> [n, width]
        return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)

    def right(x, width, value):
        return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

    logps = [r.sampling_logp for r in parts]
    return Rollout(torch.cat([left(r.prompt_ids, p, pad_id) for r in parts]),
                   torch.cat([left(r.prompt_mask, p, 0) for r in parts]),
                   torch.cat([right(r.completion_ids, t, pad_id) for r in parts]),
                   torch.cat([right(r.completion_mask, t, 0) for r in parts]),
                   torch.cat([r.truncated for r in parts]),
                   None if any(x is None for x in logps) else torch.cat([right(x, t, 0.0) for x in logps]),
                   [s for r in parts for s in r.texts], parts[0].backend, sum(r.seconds for r in parts))


def rollout_to(ro: Rollout, device) -> Rollout:
    """The rollout with its tensors on ``device``."""
    return dataclasses.replace(ro, **{f.name: getattr(ro, f.name).to(device) for f in dataclasses.fields(ro)
                                      if isinstance(getattr(ro, f.name), torch.Tensor)})


def dynamic_sample(trainer) -> tuple[list[dict], Rollout, torch.Tensor, dict]:
    """DAPO dynamic sampling (arXiv 2503.14476, section 3.2): sample and score rounds of B prompts, keep
    only groups whose rewards are not all equal, until B groups are kept or ``dynamic_sampling_rounds``
    rounds are spent. Returns this process's (samples, rollout), the step's rewards [b', G] and the
    metrics, b' <= B kept groups. When no round kept a group the last round is trained as it is (its
    groups have zero advantage, so only the KL term acts) and dynamic_sampling_empty is 1.

    On several processes the kept groups are the same as on one, in the same order (the first
    informative groups of each round, by their index in the step's draw); each process then trains
    an equal, contiguous share of them (groups move between processes as CPU tensors), so DDP and
    FSDP2 see the same number of sequences everywhere. A remainder that would not fill every process's
    mini-batches alike (fewer groups than processes x mini_batches), possible only when the rounds run
    out, is left out of the step (counted as dropped), on one process as on several."""
    cfg, world, g, n = trainer.cfg, trainer.world, trainer.cfg.num_generations, trainer.cfg.prompts_per_step
    b = n // world.size  # prompts per process and round
    mine, kept_rewards, n_kept, seconds = [], [], 0, 0.0
    for round in range(cfg.dynamic_sampling_rounds):
        samples, ro = trainer.sample(round)  # fresh sampling keys each round
        rewards, metrics = trainer.score(samples, ro)  # [B, G] of the whole step
        seconds += ro.seconds
        idx = core.informative_groups(rewards).nonzero().flatten()[: n - n_kept]  # [k] indices into the step's B
        kept_rewards.append(rewards[idx])  # [k, G]
        n_kept += len(idx)
        for i in idx.tolist():  # this process's kept groups: (round, index, sample, its G rows)
            j = i - world.rank * b
            if 0 <= j < b:
                rows = select_rollout(ro, torch.arange(j * g, (j + 1) * g))
                mine.append((round, i, samples[j], rollout_to(rows, "cpu") if world.distributed else rows))
        if n_kept >= n:
            break
    # whole mini-batches on every process when there are enough groups (then 1 and N processes take
    # the same mini-batches, passes.mini_batch_rows), else whole groups per process
    unit = world.size * cfg.mini_batches if n_kept >= world.size * cfg.mini_batches else world.size
    n_used = n_kept - n_kept % unit
    rounds = round + 1
    metrics.update(dynamic_sampling_rounds=rounds, dynamic_sampling_dropped_share=1.0 - n_used / (rounds * n),
                   dynamic_sampling_empty=int(n_used == 0), trained_groups=n_used or n)
    if n_used == 0:
        return samples, ro, rewards, metrics
    kept = sorted((x for part in dist_io.gather_objects(mine, world) for x in part), key=lambda x: x[:2])[:n_used]
    share = kept[world.rank * n_used // world.size:(world.rank + 1) * n_used // world.size]
    merged = concat_rollouts([x[3] for x in share], trainer.tok.pad_token_id)
    merged = dataclasses.replace(rollout_to(merged, ro.completion_ids.device), seconds=seconds)
    return [x[2] for x in share], merged, torch.cat(kept_rewards)[:n_used], metrics


def reshape_rewards(rewards: torch.Tensor, *, lengths: torch.Tensor, truncated: torch.Tensor,
                    cfg) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Apply the reward-side tools before advantages: the overlong penalty (added to the reward) and
    the PF-PPO filter. rewards: [B, G], lengths and truncated: [B * G] ->
    (rewards [B, G], keep [B, G] bool, metrics)."""
    metrics: dict = {}
    if cfg.overlong_buffer:  # DAPO soft overlong punishment (arXiv 2503.14476, eq. 13)
        pen = core.overlong_penalty(lengths, max_length=cfg.max_completion_length,
                                    buffer=cfg.overlong_buffer).view_as(rewards)  # [B, G]
        rewards = rewards + cfg.overlong_penalty_coef * pen
        metrics["overlong_penalty_mean"] = float(pen.mean())
    keep = torch.ones_like(rewards, dtype=torch.bool)  # [B, G]
    if cfg.overlong_filter:  # DAPO overlong filtering: truncated completions leave the loss
        keep &= ~truncated.view_as(rewards)
    if cfg.policy_filter:  # PF-PPO (arXiv 2409.06957)
        keep &= core.policy_filter(rewards, mode=cfg.policy_filter, min_std=cfg.policy_filter_min_std)
        metrics["policy_filter_kept_share"] = float(keep.float().mean())
    return rewards, keep, metrics


@torch.no_grad()
def consistency(trainer) -> dict:
    """Every ``consistency_steps`` steps: for the first ``consistency_prompts`` held-out (else training)
    prompts, sample G completions each and report the mean coefficient of variation of their rewards."""
    cfg = trainer.cfg
    pool = trainer.task.eval or trainer.task.train
    samples = pool[: cfg.consistency_prompts]
    prompts = [render_prompt(trainer.tok, s["prompt"], cfg.system_prompt) for s in samples]
    ro = generate_rollout(trainer.policy, trainer.tok, prompts, group_size=cfg.num_generations,
                          max_new_tokens=cfg.max_completion_length, temperature=trainer.stability.temperature,
                          top_p=cfg.top_p, top_k=cfg.top_k, max_prompt_length=cfg.max_prompt_length,
                          with_logprobs=False, synced=trainer.sharded)
    res = trainer.rewards.score(ro.texts, [s for s in samples for _ in range(cfg.num_generations)])
    r = torch.nan_to_num(res.total.float(), nan=0.0).view(len(samples), cfg.num_generations)  # [b, G]
    return {"consistency_cv": float(core.reward_cv(r).mean()), "consistency_reward_mean": float(r.mean())}
