"""Asynchronous GRPO: rollouts drawn while the trainer updates, within a staleness bound.

A producer thread draws the prompt stream one draw (B prompts) at a time through the collector,
whose training engine (the run's Engines) runs in a process of its own (rollout/producer.py); a
scorer thread scores each draw as it finishes, overlapping the rewards' waits (a judge model or a
sandbox) with the next draw's sampling and the trainer's update; the scored groups wait in a bounded
queue, and each step takes B of them (with DAPO dynamic sampling, one slot of informative groups that
the scorer filled from the draws it scored: async_queue). On one process on the CPU the engine's
sampling and the trainer's step take turns on the cores (``turns``): computing at once only slows both.
After each optimizer step the new weights reach the engine without stopping it (a shared-memory copy
under a lock), numbered by the trainer's step; every token carries the version that drew it.

The staleness bound ``max_staleness`` = K (TRL's name; verl's staleness threshold, NeMo-RL's
``max_trajectory_age_steps``) holds twice: the producer starts draw d only once weights of version
d - K or newer are published (admission, so nothing is sampled only to be dropped), and a group whose
staleness (the step minus the oldest version of its tokens, core.staleness) is above K when the
trainer takes it is dropped and counted (with dynamic sampling the admission counts slots, and none can be
over K). Draw d is keyed as step d of the synchronous loop (with dynamic sampling at K = 0, as the
round it is of its step), so K = 0 gives the synchronous run's tokens and updates exactly. The prompt
sampler (the difficulty sampler) hears of draw d - K - 1's pass rates just before draw d. Tokens drawn by older weights are corrected
by the importance weight pi_train / pi_version (TIS or MIS, core.stale_correction) unless the
run's mismatch correction (``rollout_correction``) already weighs every token.

On several processes (torchrun: DDP or FSDP2) each process runs its own engine process, producer and
scorer on its share of each draw (B / world prompts, keyed as the synchronous loop keys them); the
producers and the scorers count and gather over process groups of their own (distributed.side_world),
so their collectives never interleave with the trainer's, and the producers agree before each draw
whether to make it, so every process makes the same draws and a stop leaves no collective waiting.
Each process takes its own share of a step's groups; the step's rewards and metrics are gathered.

A checkpoint records where the prompt stream stood at the oldest draw with groups not yet trained,
and which of its groups (and of later draws; by their index in the whole draw, gathered from every
process) were trained or dropped, with the pass rates the next draws are still to hear of; a resumed
run, on any number of processes, draws those again, so no prompt draw is lost or trained twice. The queue itself is not saved: its groups are
sampled anew by the resumed weights, so a resumed run is not bit-exact.

Dimension letters: B prompts (groups) per step, G group size, N = B*G sequences, T completion tokens,
K reward functions.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass

import torch

from grpo.core import staleness as st
from grpo.errors import RewardError
from grpo.infra import distributed
from grpo.rollout.types import Rollout, concat_rollouts, select_rollout
from grpo.train.async_metrics import process_part, queue_metrics, trained_metrics
from grpo.train.async_queue import (FillerAt, Group, SlotFiller, StreamPosition, Taken, get_or_raise, group_staleness,
                                    merged_stream, put_unless, take_batch)
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
    dynamic_sampling: bool  # dynamic_sampling: the queue holds slots (train/async_queue.py)
    dynamic_sampling_rounds: int  # dynamic_sampling_rounds
    mini_batches: int  # mini_batches: a slot's groups are shared out in whole mini-batches
    turns: bool  # async_turns, resolved: the engine's sampling and the trainer's step take turns on the cores


@dataclass(frozen=True)
class SideWorlds:
    """The process groups the producer and the scorer count and gather over (one process: the run's)."""

    producer: distributed.World
    scorer: distributed.World


class AsyncRollouts:
    """The producer, the scorer and the queue between them and the trainer. The ``collector`` draws
    (from its prompt sampler, the stream) and scores; it samples with the run's training engine, the
    engine process, which holds the weights of ``version`` (``new_weights`` tells of later ones). The
    threads start at the first ``collect`` and again after ``stop`` and ``join`` (a later train()),
    where the stream stands. ``world``: the run's processes (built on every one of them, in the same
    order: it makes the producer's and the scorer's process groups)."""

    def __init__(self, settings: AsyncSettings, *, collector: Collector, world: distributed.World | None = None,
                 version: int = 0):
        self.s, self.collector = settings, collector
        self.world = world or distributed.World()
        self.sides = SideWorlds(distributed.side_world(self.world), distributed.side_world(self.world))
        self.share = settings.prompts_per_step // self.world.size  # b: this process's groups of each draw
        self.version, self.temperature = version, None  # the newest weights published, and their temperature
        self.cond = threading.Condition()
        # the stream: sampler position at the start of draw `first`, and the (draw, group) pairs of
        # draws >= first already trained or dropped (group: its index in the whole draw)
        self.stream = StreamPosition(0, collector.sampler.state_dict(), settings.max_staleness + 1)
        self.first_start = 0  # the stream's first draw when the threads last started
        self.dropped_total = 0  # over every process
        self._reset()

    def _reset(self) -> None:
        """No threads, an empty queue: what the next ``collect`` starts from."""
        b, k = self.share, self.s.max_staleness
        self.groups: queue.Queue = queue.Queue(maxsize=(k + 1) * (1 if self.s.dynamic_sampling else b))  # slots or groups
        self.filler: SlotFiller | None = None  # dynamic sampling: the slot being filled (the scorer's)
        # taking turns (async_turns): the draw the producer waits to make, and who computes now
        self.waiting: tuple[int, int] | None = None
        self.sampling = self.computing = False
        self.to_score: queue.Queue = queue.Queue(maxsize=1)
        self.stream.starts = {}  # draw -> sampler position at its start, once drawn
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None
        self.threads: list[threading.Thread] = []

    def _mine(self) -> range:
        """This process's groups of a draw, by their index in the whole draw."""
        return range(self.world.rank * self.share, (self.world.rank + 1) * self.share)

    # ---- the trainer's side ----------------------------------------------------------------------
    def new_weights(self, *, version: int, temperature: float) -> None:
        """The engine process has the trainer's weights after ``version`` optimizer steps (the run's
        Engines published them); the producer may start the draws they admit."""
        with self.cond:
            self.version, self.temperature = version, temperature
            self.cond.notify_all()

    def _take_turn(self) -> None:
        """async_turns: the trainer computes its step once the engine is not sampling and no draw is
        admitted but not yet started (sampling first: the draw's rewards are then awaited while the
        trainer computes); the turn (the update, the weights published, an evaluation or a checkpoint
        after it) ends at the next ``collect``, where the trainer waits for groups."""
        if not self.s.turns:
            return
        with self.cond:
            while (self.sampling or (self.waiting is not None and self._admits(*self.waiting))) \
                    and not self.stop_flag.is_set():
                self.cond.wait(WAIT)
            self.computing = True

    def collect(self, *, step: int, temperature: float) -> Collected:
        """This process's b groups of staleness at most K for ``step`` (those over it dropped and
        counted), with the step's rewards and metrics over every process's groups."""
        with self.cond:  # the trainer's turn (async_turns) ends where it waits for groups
            self.computing = False
            self.cond.notify_all()
        if self.threads and self.stop_flag.is_set():  # threads an earlier join outwaited: end them first
            self.join(timeout=None)
        if not self.threads:
            self._start(temperature, step)
        b, k, g = self.share, self.s.max_staleness, self.s.group_size
        t0 = time.perf_counter()
        failed, slot = None, None
        try:
            if self.filler is not None:  # a whole slot, its staleness within K by the admission rule
                slot = self._take()
                if slot.step != step:  # the filler numbers its slots from the step the threads started at
                    raise RuntimeError(f"asynchronous rollouts: step {step} took the slot of step {slot.step}")
                taken = Taken(slot.groups, [], [group_staleness(x, step=step, group_size=g) for x in slot.groups])
            else:
                taken = take_batch(self._take, count=b, step=step, max_staleness=k, group_size=g)
        except RewardError as e:  # decided over every process's scores: each raises it, at its own step
            failed = e
        if self.world.distributed and distributed.all_max(int(failed is not None), self.world):
            raise failed or RewardError("the rewards failed on another process; stopped with it")
        if failed is not None:
            raise failed
        kept = taken.kept
        waited = time.perf_counter() - t0
        self._mark(slot.pairs if slot is not None else [(x.draw, x.index) for x in kept + taken.dropped])
        sources = self.collector.sources
        everyone = distributed.gather_objects(process_part(
            kept, dropped=len(taken.dropped), staleness=taken.staleness, waited=waited, queued=self._queued(),
            labels_of=sources.column if sources is not None else None, group_size=g), self.world)
        self.dropped_total += sum(p["dropped"] for p in everyone)
        ro = concat_rollouts([x.rollout for x in kept], self.collector.tok.pad_token_id)
        # sampling seconds: every round of a slot, else a draw's (its groups' rollouts each carry the draw's)
        ro = dataclasses.replace(ro, seconds=slot.seconds if slot is not None else
                                 sum(x.rollout.seconds for x in kept) / len(kept))
        rewards = torch.cat([p["rewards"] for p in everyone])  # [B, G]
        per = torch.cat([p["per_reward"] for p in everyone])  # [B, G, K]
        # a slot (dynamic sampling): the figures of the draw that closed it, as the synchronous step reports its
        # last round's; else those of the groups trained
        metrics = dict(slot.metrics) if slot is not None else \
            trained_metrics(kept[-1].metrics, everyone, reward_names=self.collector.rewards.names, sources=sources)
        metrics.update(queue_metrics(everyone, max_staleness=k, trained=len(rewards), dropped_total=self.dropped_total))
        columns = {key: [v for x in kept for v in x.columns.get(key, [])] for key in kept[0].columns}
        self._take_turn()
        return Collected([x.sample for x in kept], ro, rewards, metrics, per_reward=per, columns=columns)

    def _queued(self) -> int:
        """Groups waiting in this process's queue (of its queued slots, with dynamic sampling)."""
        if self.filler is None:
            return self.groups.qsize()
        with self.groups.mutex:
            return sum(len(x.groups) for x in self.groups.queue if x is not None)

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
        batch, corr_metrics = apply_logp_weight(batch, LogpWeight(prefix="async/", weigh=weigh), batch.correction_logp)
        return batch, {**out, **corr_metrics}

    def _take(self):
        """The next scored group (slot); once the producer or the scorer failed, those scored before the
        failure first, then the failure (on several processes only a RewardError gets here, which every
        process meets: any other ended its process in ``_guard``)."""
        return get_or_raise(self.groups, lambda: self.error, wait=WAIT)

    def _mark(self, pairs) -> None:
        """Groups trained or dropped (the stream moves past draws with none of this process's left)."""
        with self.cond:
            self.stream.mark(pairs, self._mine())

    # ---- the producer and the scorer ------------------------------------------------------------
    def _start(self, temperature: float, step: int) -> None:
        """The producer and the scorer, from the stream's oldest draw with groups not yet trained; with
        dynamic sampling the first slot filled is ``step``'s."""
        if self.world.distributed:  # every process restarts at the same draw (a collective, in collect)
            self.load_state_dict(self.state_dict())
        self.temperature = self.temperature if self.temperature is not None else temperature
        self.collector.sampler.load_state_dict(self.stream.start)
        s = self.s
        if s.dynamic_sampling:
            self.filler = SlotFiller(s.prompts_per_step, self.share, s.dynamic_sampling_rounds, s.mini_batches,
                                     self.sides.scorer, FillerAt(step))
        self.first_start = self.stream.first
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
                if self.world.distributed and not isinstance(e, RewardError):
                    self._leave(e)

    def _leave(self, e: BaseException) -> None:
        """A failure of this process alone under torchrun: the others wait in collectives it will not
        join, and its own main thread may be waiting in one of theirs (the gradient all-reduce), so the
        process leaves now, saying why; torchrun then ends the others."""
        print(f"grpo train: error: asynchronous rollouts failed on process {self.world.rank} ({type(e).__name__}: "
              f"{e}); the other processes wait in collectives this one will not join, so the run ends here "
              "without a checkpoint (torchrun ends the others; resume from the latest periodic checkpoint, "
              "save_steps)", file=sys.stderr, flush=True)
        os._exit(1)

    def _produce(self) -> None:
        """Draw after draw, each once the weights it needs are published; every process agrees before a
        draw whether to make it (a stop on any one ends them all), so all make the same draws and
        their counts (collectives) meet. The scorer hears of the end (None)."""
        d, world, made = self.stream.first, self.sides.producer, 0
        try:
            while True:
                with self.cond:
                    self.waiting = (d, made)
                    while not (self._admits(d, made) and not self.computing or self.stop_flag.is_set()):
                        self.cond.wait(WAIT)
                    self.waiting, self.sampling = None, self.s.turns
                    temperature = self.temperature
                    key = self._key(d, made)
                if distributed.all_max(int(self.stop_flag.is_set()), world):
                    return
                self._hear_outcomes(d)
                try:
                    samples, ro = self.collector.sample(step=key[0], draw=key[1], temperature=temperature, world=world)
                finally:
                    with self.cond:  # the trainer's turn, if it waits for one
                        self.sampling = False
                        self.cond.notify_all()
                self.stream.starts[d + 1] = self.collector.sampler.state_dict()  # before any group of d can be taken
                self._hand_over((d, key[0], samples, ro))
                d, made = d + 1, made + 1
        finally:
            self._hand_over(None)

    def _admits(self, d: int, made: int) -> bool:
        """Whether draw d (the ``made``-th since the threads started) may be made now (under the lock):
        once the weights it needs are published, and the draw whose outcomes it hears is scored. Without
        dynamic sampling draw d is step d's, which needs version d - K; with it, the slot it can land in
        at the latest (the scorer's open slot plus the draws in flight, async_queue) must be within K
        of the newest version."""
        heard = d - self.stream.lag  # the draw whose pass rates the prompt sampler hears of first
        if heard >= self.first_start and heard not in self.stream.observed:
            return False
        if self.filler is None:
            return self.version >= d - self.s.max_staleness
        return self.filler.at.latest_slot(made) <= self.version + self.s.max_staleness

    def _key(self, d: int, made: int) -> tuple[int, int]:
        """(step, round) draw d's rows are keyed by: step d's (the synchronous loop's keys of step d); with
        dynamic sampling at K = 0 the synchronous loop's round of the slot being filled (every process
        reads the same there: nothing is in flight), at K > 0 step d's again, which every process agrees on."""
        if self.filler is None or self.s.max_staleness > 0:
            return d, 0
        return self.filler.at.key(made)

    def _hear_outcomes(self, d: int) -> None:
        """The prompt sampler hears of draw d - K - 1's group pass rates just before draw d, whenever they
        were scored, so the draws do not depend on the threads' timing (the synchronous loop's order when
        K = 0: each draw hears of the one before it)."""
        heard = d - self.stream.lag
        if heard >= 0:
            with self.cond:
                rates = self.stream.observed.get(heard)
            if rates is not None:
                self.collector.sampler.observe(rates)

    def _hand_over(self, item) -> None:
        """To the scorer, which takes every draw made (none is lost to a stop: each process's scorer
        must meet the others' over it), unless the scorer failed."""
        put_unless(self.to_score, item, lambda: self.error is not None and self.stop_flag.is_set(), wait=WAIT)

    def _score(self) -> None:
        """Each draw's groups into the queue, this process's share of them; after a stop the draws
        left are passed over, by every process alike (they agree on each). With dynamic sampling the
        queue takes whole slots (async_queue). Each draw's pass rates are kept for the producer."""
        world = self.sides.scorer
        while True:
            try:
                item = self.to_score.get(timeout=WAIT)
            except queue.Empty:
                continue
            if item is None:
                return
            if distributed.all_max(int(self.stop_flag.is_set()), world):
                continue
            d, step, samples, ro = item
            rewards, metrics = self.collector.score(samples, ro, step=step, world=world, observe=False)  # [B, G]
            with self.cond:  # before the filler moves on: a draw it admits hears of these
                self.stream.observed[d] = self.collector.last_pass_rates
                self.cond.notify_all()
            groups = self._groups(d, samples, ro, rewards, metrics)
            slot = self.filler.add(d, groups, rewards, self.stream.done) if self.filler is not None else None
            if slot is not None:
                with self.cond:  # the producer may wait on the slot's close
                    self.cond.notify_all()
            if self.filler is None:
                for grp in groups:
                    if (grp.draw, grp.index) not in self.stream.done:  # trained or dropped before a resume
                        put_unless(self.groups, grp, self.stop_flag.is_set, wait=WAIT)
            elif slot is not None:
                put_unless(self.groups, slot, self.stop_flag.is_set, wait=WAIT)

    def _groups(self, d: int, samples: list[dict], ro: Rollout, rewards: torch.Tensor, metrics: dict) -> list[Group]:
        """This process's b scored groups of draw d (from the collector's last scoring)."""
        g, c = self.s.group_size, self.collector
        out = []
        for i, (j, sample) in enumerate(zip(self._mine(), samples)):  # i: this process's, j: the draw's
            rows = torch.arange(j * g, (j + 1) * g)  # of the whole draw's [N] gathered tensors
            part = {key: v[i * g:(i + 1) * g] for key, v in c.last_columns.items() if len(v) == len(ro.texts)}
            out.append(Group(d, j, sample, select_rollout(ro, torch.arange(i * g, (i + 1) * g)), rewards[j],
                             c.last_per_reward[j], c.last_correct[rows], c.last_scores[rows], c.last_per_scores[rows],
                             part, metrics))
        return out

    # ---- state and shutdown ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Where the stream stands over every process (a collective of the trainer's processes): the
        oldest draw with a group not yet trained, and the groups of it and later draws trained or
        dropped, so a run resumed on any number of processes draws the rest again."""
        with self.cond:
            mine = self.stream.part(self._mine())
        return {**merged_stream(distributed.gather_objects(mine, self.world)), "dropped_total": self.dropped_total}

    def load_state_dict(self, state: dict) -> None:
        """Where the stream stood (restored after the collector, whose sampler it sets back)."""
        with self.cond:
            self.stream.load(state)
        self.dropped_total = state["dropped_total"]
        self.collector.sampler.load_state_dict(self.stream.start)

    def stop(self) -> None:
        """The threads stop at their next check: the producer before its next draw, the scorer before
        its next scoring; one waiting on the engine process is freed when the run's Engines close it
        (then ``join``)."""
        self.stop_flag.set()

    def join(self, timeout: float | None = 10.0) -> bool:
        """Wait (up to ``timeout`` seconds for each) for the stopped threads; once none is alive the
        queue's groups are let go (the next ``collect`` draws them again from where the stream stands)
        and True is returned. Threads still alive (on a process whose peers failed) keep their queues
        and stop flag, so they cannot start again; the next ``join`` waits for them anew."""
        self.stop_flag.set()
        for t in self.threads:
            t.join(timeout=timeout)
        if any(t.is_alive() for t in self.threads):
            return False
        self._reset()
        return True
