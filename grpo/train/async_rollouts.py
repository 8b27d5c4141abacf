"""Asynchronous GRPO: rollouts drawn while the trainer updates, within a staleness bound.

A producer thread draws the prompt stream one draw (B prompts) at a time and samples it through an
engine in a process of its own (rollout/producer.py); a scorer thread scores each draw as it
finishes, overlapping the rewards' waits (a judge model or a sandbox) with the next draw's sampling
and the trainer's update; the scored groups wait in a bounded queue, and each step takes B of them.
After each optimizer step the new weights reach the engine without stopping it (a shared-memory copy
under a lock), numbered by the trainer's step; every token carries the version that drew it.

The staleness bound ``max_staleness`` = K (TRL's name; verl's staleness threshold, NeMo-RL's
``max_trajectory_age_steps``) holds twice: the producer starts draw d only once weights of version
d - K or newer are published (admission, so nothing is sampled only to be dropped), and a group whose
staleness (the step minus the oldest version of its tokens, core.staleness) is above K when the
trainer takes it is dropped and counted. Draw d is keyed as step d of the synchronous loop, so K = 0
gives the synchronous run's tokens and updates exactly. Tokens drawn by older weights are corrected
by the importance weight pi_train / pi_version (TIS or MIS, core.stale_correction) unless the
run's mismatch correction (``rollout_correction``) already weighs every token.

A checkpoint records where the prompt stream stood at the oldest draw with groups not yet trained,
and which of its groups (and of later draws) were trained or dropped; a resumed run draws those
again, so no prompt draw is lost or trained twice. The queue itself is not saved: its groups are
sampled anew by the resumed weights, so a resumed run is not bit-exact.

Dimension letters: B prompts (groups) per step, G group size, N = B*G sequences, T completion tokens,
K reward functions.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from dataclasses import dataclass

import torch

from grpo.core import staleness as st
from grpo.rollout.base import Rollout, concat_rollouts, select_rollout
from grpo.rollout.producer import EngineProcess, EngineProcessSettings, ProcessEngine
from grpo.train.collect import Collected, Collector

WAIT = 0.2  # seconds between checks of the stop flag in a blocking wait


@dataclass(frozen=True)
class AsyncSettings:
    """The asynchronous pipeline's settings (from the run's config: ``from_config``)."""

    max_staleness: int
    prompts_per_step: int
    group_size: int
    correction: str  # truncate (TIS) or mask (MIS) of the stale tokens' importance weights
    correction_level: str
    correction_low: float | None
    correction_high: float | None
    run_corrects_all: bool  # the run's rollout_correction already weighs every token
    engine: EngineProcessSettings

    @classmethod
    def from_config(cls, cfg, *, run_correction: str) -> "AsyncSettings":
        from grpo.rollout.engine import engine_options

        return cls(max_staleness=cfg.max_staleness, prompts_per_step=cfg.prompts_per_step,
                   group_size=cfg.num_generations, correction=cfg.async_correction,
                   correction_level=cfg.rollout_correction_level, correction_low=cfg.rollout_correction_low,
                   correction_high=cfg.rollout_correction_high, run_corrects_all=run_correction != "none",
                   engine=EngineProcessSettings(backend=cfg.rollout_backend, kernels=cfg.decode_kernels,
                                                options=engine_options(cfg.to_dict(), cfg.rollout_backend),
                                                threads=cfg.async_engine_threads,
                                                segment_tokens=cfg.partial_rollout_tokens if cfg.partial_rollouts else 0))


@dataclass
class Group:
    """One prompt's G scored completions, as the queue holds them."""

    draw: int
    index: int  # within its draw
    sample: dict
    rollout: Rollout  # G rows, with versions
    rewards: torch.Tensor  # [G]
    per_reward: torch.Tensor  # [G, K]
    columns: dict
    metrics: dict  # its draw's scoring metrics


@dataclass
class Taken:
    """A step's groups: those trained, those dropped, and the staleness of each taken, in order."""

    kept: list[Group]
    dropped: list[Group]
    staleness: list[int]


def take_batch(next_group, *, count: int, step: int, max_staleness: int, group_size: int) -> Taken:
    """Groups from ``next_group()`` until ``count`` have a staleness of at most ``max_staleness`` at
    ``step`` (core.sample_staleness); the others are dropped."""
    out = Taken([], [], [])
    while len(out.kept) < count:
        grp = next_group()
        ro = grp.rollout
        s = int(st.sample_staleness(ro.versions, ro.loss_mask, step=step, group_size=group_size)[0])  # model tokens
        (out.dropped if s > max_staleness else out.kept).append(grp)
        out.staleness.append(s)
    return out


class AsyncRollouts:
    """The producer, the scorer and the queue between them and the trainer. ``engine`` (in its own
    process, holding ``policy``'s weights of ``version``) is what the producer samples with; the
    collector bound to it (``bind``) draws and scores, its prompt sampler being the stream. ``state``:
    an earlier pipeline's (state_dict), where the stream continues."""

    def __init__(self, settings: AsyncSettings, *, policy, tokenizer, version: int, state: dict | None = None):
        self.s = settings
        self.collector: Collector | None = None
        self.process = EngineProcess(policy, tokenizer, settings.engine, version=version)
        self.engine = ProcessEngine(policy, tokenizer, process=self.process)
        b, k = settings.prompts_per_step, settings.max_staleness
        self.groups: queue.Queue = queue.Queue(maxsize=(k + 1) * b)
        self.to_score: queue.Queue = queue.Queue(maxsize=1)
        self.cond = threading.Condition()
        self.published, self.temperature = version, None
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.threads: list[threading.Thread] = []
        # the stream: sampler position at the start of draw `first`, and the (draw, group) pairs of
        # draws >= first already trained or dropped
        self.first, self.start_state, self.done = 0, None, set()
        self.starts: dict[int, dict] = {}
        self.dropped_total = 0
        self._state = state

    def bind(self, collector: Collector) -> None:
        """The collector that draws (from its prompt sampler) and scores; its sampler is set to
        where the stream stands."""
        if self.collector is collector:
            return
        self.collector = collector
        if self._state is not None:
            self.load_state_dict(self._state)
        elif self.start_state is None:
            self.start_state = collector.sampler.state_dict()

    # ---- the trainer's side ----------------------------------------------------------------------
    def publish(self, policy, *, version: int, temperature: float) -> None:
        """The trainer's new weights (after its optimizer steps), numbered ``version`` = its step."""
        self.process.publish(policy, version)
        with self.cond:
            self.published, self.temperature = version, temperature
            self.cond.notify_all()

    def collect(self, *, step: int, temperature: float) -> Collected:
        """B groups of staleness at most K for ``step``; those over it are dropped and counted."""
        if not self.threads:
            self._start(temperature)
        b, k, g = self.s.prompts_per_step, self.s.max_staleness, self.s.group_size
        t0 = time.perf_counter()
        taken = take_batch(self._take, count=b, step=step, max_staleness=k, group_size=g)
        kept, dropped, stale_of = taken.kept, taken.dropped, taken.staleness
        waited = time.perf_counter() - t0
        self._mark([(x.draw, x.index) for x in kept + dropped])
        self.dropped_total += len(dropped)
        hist = st.staleness_histogram(torch.tensor(stale_of), max_staleness=k).tolist()
        ro = concat_rollouts([x.rollout for x in kept], self.collector.tok.pad_token_id)
        ro = dataclasses.replace(ro, seconds=sum(x.rollout.seconds for x in kept) / b)  # a draw's sampling time
        rewards = torch.stack([x.rewards for x in kept])  # [B, G]
        per = torch.stack([x.per_reward for x in kept])  # [B, G, K]
        metrics = dict(kept[-1].metrics)
        metrics.update({f"rewards/{n}": float(torch.nanmean(per[..., i])) for i, n in
                        enumerate(self.collector.cfg.reward_names)})
        metrics["accuracy"] = float((per[..., 0] >= 1.0).double().mean())
        kept_stale = [s for s in stale_of if s <= k]
        metrics.update({f"async/staleness_{i}": c for i, c in enumerate(hist[:-1])})
        metrics.update({"async/staleness_over": hist[-1], "async/staleness_mean": sum(kept_stale) / b,
                        "async/staleness_max": max(kept_stale), "async/dropped_groups": len(dropped),
                        "async/dropped_share": len(dropped) / (len(dropped) + b),
                        "async/dropped_total": self.dropped_total, "async/wait_seconds": waited,
                        "async/queued_groups": self.groups.qsize(), "async/oldest_draw": min(x.draw for x in kept)})
        columns = {key: [v for x in kept for v in x.columns.get(key, [])] for key in kept[0].columns}
        return Collected([x.sample for x in kept], ro, rewards, metrics, per_reward=per, columns=columns)

    def correct(self, batch, *, step: int, train_logps) -> dict:
        """Weight the advantages of tokens drawn by weights older than ``step``'s by pi_train /
        pi_version (``train_logps()``: the trainer's log-probs of the batch [n, T]); nothing when no
        token is stale (K = 0 stays exact) or the run's rollout_correction already weighs them all."""
        ro = batch.rollout
        stale = st.stale_tokens(ro.versions, batch.mask, step=step)  # [n, T]
        out = {"async/stale_token_share": float(stale.sum() / batch.mask.sum().clamp(min=1))}
        if self.s.run_corrects_all or not bool(stale.any()):
            return out
        train = train_logps()  # [n, T]
        corr = st.stale_correction(train, ro.sampling_logp.to(train.dtype), batch.mask, stale,
                                   level=self.s.correction_level, mode=self.s.correction,
                                   low=self.s.correction_low, high=self.s.correction_high)
        batch.advantages = batch.advantages * corr.weights  # [n, T]
        out.update({f"async/{k}": float(v) for k, v in corr.metrics.items()})
        return out

    def _take(self) -> Group:
        while True:
            if self.error is not None:
                raise self.error
            try:
                return self.groups.get(timeout=WAIT)
            except queue.Empty:
                continue

    def _mark(self, pairs) -> None:
        """Groups trained or dropped; the stream's start moves past draws with none left."""
        self.done.update(pairs)
        b = self.s.prompts_per_step
        while all((self.first, i) in self.done for i in range(b)):
            self.done -= {(self.first, i) for i in range(b)}
            self.first += 1
            self.start_state = self.starts.pop(self.first, self.start_state)

    # ---- the producer and the scorer ------------------------------------------------------------
    def _start(self, temperature: float) -> None:
        self.temperature = self.temperature if self.temperature is not None else temperature
        self.collector.sampler.load_state_dict(self.start_state)
        self.threads = [threading.Thread(target=self._guard, args=(fn,), daemon=True, name=f"grpo-async-{fn.__name__}")
                        for fn in (self._produce, self._score)]
        for t in self.threads:
            t.start()

    def _guard(self, fn) -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed to the trainer, which raises it
            if not self.stop.is_set():
                self.error = e
                self.stop.set()

    def _produce(self) -> None:
        d = self.first
        while not self.stop.is_set():
            with self.cond:
                while self.published < d - self.s.max_staleness and not self.stop.is_set():
                    self.cond.wait(WAIT)
                temperature = self.temperature
            if self.stop.is_set():
                return
            samples, ro = self.collector.sample(step=d, temperature=temperature)
            self.starts[d + 1] = self.collector.sampler.state_dict()  # before any group of d can be taken
            self._put(self.to_score, (d, samples, ro))
            d += 1

    def _score(self) -> None:
        g = self.s.group_size
        while not self.stop.is_set():
            try:
                d, samples, ro = self.to_score.get(timeout=WAIT)
            except queue.Empty:
                continue
            rewards, metrics = self.collector.score(samples, ro, step=d)  # [B, G]
            per, cols = self.collector.last_per_reward, self.collector.last_columns
            for i, sample in enumerate(samples):
                if (d, i) in self.done:  # trained or dropped before a resume
                    continue
                rows = torch.arange(i * g, (i + 1) * g)
                part = {key: v[i * g:(i + 1) * g] for key, v in cols.items() if len(v) == len(ro.texts)}
                self._put(self.groups, Group(d, i, sample, select_rollout(ro, rows), rewards[i], per[i], part, metrics))

    def _put(self, q: queue.Queue, item) -> None:
        while not self.stop.is_set():
            try:
                q.put(item, timeout=WAIT)
                return
            except queue.Full:
                continue

    # ---- state and shutdown ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"first_draw": self.first, "sampler": self.start_state, "done": sorted(self.done),
                "dropped_total": self.dropped_total}

    def load_state_dict(self, state: dict) -> None:
        self.first, self.start_state = state["first_draw"], state["sampler"]
        self.done = {tuple(x) for x in state["done"]}
        self.dropped_total = state["dropped_total"]
        self._state = None
        if self.collector is not None:
            self.collector.sampler.load_state_dict(self.start_state)

    def close(self) -> None:
        """Stop the threads and the engine process (a producer blocked in a call sees it end)."""
        self.stop.set()
        self.engine.close()
        for t in self.threads:
            t.join(timeout=10.0)

    @property
    def closed(self) -> bool:
        return self.engine.closed
