"""Asynchronous GRPO: rollouts drawn while the trainer updates, within a staleness bound.

A producer thread draws the prompt stream one draw (B prompts) at a time through the collector,
whose training engine (the run's Engines) runs in a process of its own (rollout/producer.py); a
scorer thread scores each draw as it finishes, overlapping the rewards' waits (a judge model or a
sandbox) with the next draw's sampling and the trainer's update; the scored groups wait in a bounded
queue, and each step takes B of them.
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
from grpo.train.batch import Batch, LogpWeight, apply_logp_weight
from grpo.train.collect import Collected, Collector

WAIT = 0.2  # seconds between checks of the stop flag in a blocking wait


@dataclass(frozen=True)
class AsyncSettings:
    """What the asynchronous pipeline reads; each field is the Config field named in its comment (the
    engine process's own settings go to the run's Engines: rollout/producer.py)."""

    max_staleness: int  # max_staleness (K)
    prompts_per_step: int  # prompts_per_step (B)
    group_size: int  # num_generations (G)
    correction: str  # async_correction: truncate (TIS) or mask (MIS) of the stale tokens' importance weights
    correction_level: str  # rollout_correction_level
    correction_low: float | None  # rollout_correction_low
    correction_high: float | None  # rollout_correction_high
    run_corrects_all: bool  # rollout_correction (auto resolved) is on: it already weighs every token
    reward_names: tuple[str, ...]  # rewards, in order (the first one's accuracy is logged)


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
    """The producer, the scorer and the queue between them and the trainer. The ``collector`` draws
    (from its prompt sampler, the stream) and scores; it samples with the run's training engine, the
    engine process, which holds the weights of ``version`` (``new_weights`` tells of later ones). The
    threads start at the first ``collect`` and again after ``stop`` and ``join`` (a later train()),
    where the stream stands."""

    def __init__(self, settings: AsyncSettings, *, collector: Collector, version: int = 0):
        self.s, self.collector = settings, collector
        self.version, self.temperature = version, None  # the newest weights published, and their temperature
        self.cond = threading.Condition()
        # the stream: sampler position at the start of draw `first`, and the (draw, group) pairs of
        # draws >= first already trained or dropped
        self.first, self.start_state, self.done = 0, collector.sampler.state_dict(), set()
        self.dropped_total = 0
        self._reset()

    def _reset(self) -> None:
        """No threads, an empty queue: what the next ``collect`` starts from."""
        b, k = self.s.prompts_per_step, self.s.max_staleness
        self.groups: queue.Queue = queue.Queue(maxsize=(k + 1) * b)
        self.to_score: queue.Queue = queue.Queue(maxsize=1)
        self.starts: dict[int, dict] = {}  # draw -> sampler position at its start, once drawn
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None
        self.threads: list[threading.Thread] = []

    # ---- the trainer's side ----------------------------------------------------------------------
    def new_weights(self, *, version: int, temperature: float) -> None:
        """The engine process has the trainer's weights after ``version`` optimizer steps (the run's
        Engines published them); the producer may start the draws they admit."""
        with self.cond:
            self.version, self.temperature = version, temperature
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
        metrics.update({f"rewards/{n}": float(torch.nanmean(per[..., i])) for i, n in enumerate(self.s.reward_names)})
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

    def correct(self, batch: Batch, *, step: int) -> tuple[Batch, dict]:
        """The batch with the advantages of tokens drawn by weights older than ``step``'s weighted by
        pi_train / pi_version (batch.LogpWeight: now from the old policy's log-probs where the batch has
        them, else in the update's own forward), and the metrics; the batch as it is when no token is
        stale (K = 0 stays exact) or the run's rollout_correction already weighs them all."""
        ro, s = batch.rollout, self.s
        stale = st.stale_tokens(ro.versions, batch.mask, step=step)  # [n, T]
        out = {"async/stale_token_share": float(stale.sum() / batch.mask.sum().clamp(min=1))}
        if s.run_corrects_all or not bool(stale.any()):
            return batch, out
        engine, mask = ro.sampling_logp, batch.mask  # [n, T] each

        def weigh(train_logp: torch.Tensor, rows: torch.Tensor):
            return st.stale_correction(train_logp, engine[rows].to(train_logp.dtype), mask[rows], stale[rows],
                                       level=s.correction_level, mode=s.correction,
                                       low=s.correction_low, high=s.correction_high)
        batch, corr_metrics = apply_logp_weight(batch, LogpWeight(prefix="async/", weigh=weigh), batch.old_logp)
        return batch, {**out, **corr_metrics}

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
            if not self.stop_flag.is_set():
                self.error = e
                self.stop_flag.set()

    def _produce(self) -> None:
        d = self.first
        while not self.stop_flag.is_set():
            with self.cond:
                while self.version < d - self.s.max_staleness and not self.stop_flag.is_set():
                    self.cond.wait(WAIT)
                temperature = self.temperature
            if self.stop_flag.is_set():
                return
            samples, ro = self.collector.sample(step=d, temperature=temperature)
            self.starts[d + 1] = self.collector.sampler.state_dict()  # before any group of d can be taken
            self._put(self.to_score, (d, samples, ro))
            d += 1

    def _score(self) -> None:
        g = self.s.group_size
        while not self.stop_flag.is_set():
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
        while not self.stop_flag.is_set():
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
        """Where the stream stood (restored after the collector, whose sampler it sets back)."""
        self.first, self.start_state = state["first_draw"], state["sampler"]
        self.done = {tuple(x) for x in state["done"]}
        self.dropped_total = state["dropped_total"]
        self.collector.sampler.load_state_dict(self.start_state)

    def stop(self) -> None:
        """The threads stop at their next check; one waiting on the engine process is freed when the
        run's Engines close it (then ``join``)."""
        self.stop_flag.set()

    def join(self) -> None:
        """Wait for the stopped threads; the queue's groups are let go (the next ``collect`` draws
        them again from where the stream stands)."""
        self.stop_flag.set()
        for t in self.threads:
            t.join(timeout=10.0)
        self._reset()
