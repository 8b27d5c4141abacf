"""What the asynchronous queue holds: scored groups, or with DAPO dynamic sampling, whole slots.

Groups: each prompt's G scored completions, taken by the trainer B at a time (``take_batch``), those
drawn more than K steps ago dropped.

Slots, with dynamic sampling (DAPO, arXiv 2503.14476, section 3.2: only groups whose rewards are not
all equal reach the loss, and more rounds are sampled until the step has B of them): the producer's
draws are those rounds. The scorer fills slot s (the groups step s trains) with the first informative
groups of each scored draw, as the synchronous loop fills its step (the rest of the draw, uninformative
or past B, is dropped), and closes the slot at B groups or after ``dynamic_sampling_rounds`` draws; a
slot no draw gave a group trains its last draw as it is (zero advantage: only the KL term acts), as the
synchronous loop does.

Each draw fills exactly one slot, so a draw made while the scorer fills slot ``open`` with ``inflight``
draws not yet scored lands in a slot no later than ``open + inflight``: the producer makes a draw only
when that is at most the version of the newest weights + K, which keeps every group's staleness within
K without dropping one (the admission rule of AReaL's rollout controller, counted in draws). With K = 0
nothing is in flight when a draw is made, and it is keyed as the synchronous loop keys round r of
step s (``SlotFiller.key``), so K = 0 gives its tokens and updates.

On several processes every scorer sees the whole draw's rewards (gathered), so all fill the same
slots; a closed slot's groups are shared out as the synchronous loop shares them (``kept_share``:
whole mini-batches on every process where there are enough groups).

Dimension letters: B prompts (groups) per step over every process, b per process, G group size.
"""

from __future__ import annotations

import dataclasses
import queue
from dataclasses import dataclass, field

import torch

from grpo import core
from grpo.agent.episodes import episode_counts
from grpo.core import staleness as st
from grpo.infra import distributed
from grpo.rollout.types import Rollout, rollout_to


@dataclass
class Group:
    """One prompt's G scored completions, as the queue holds them."""

    draw: int
    index: int  # within its draw (of B prompts, over every process)
    sample: dict
    rollout: Rollout  # G rows, with versions
    rewards: torch.Tensor  # [G]
    per_reward: torch.Tensor  # [G, K]
    correct: torch.Tensor  # [G] bool: the row's verifier (a mixture's: its source's) says so
    scores: torch.Tensor  # [G] float64 total reward and [G, K] each reward's, as the step's metrics average them
    per_scores: torch.Tensor
    columns: dict
    metrics: dict  # its draw's scoring metrics


@dataclass
class Taken:
    """A step's groups: those trained, those dropped, and the staleness of each taken, in order."""

    kept: list[Group]
    dropped: list[Group]
    staleness: list[int]


def group_staleness(grp: Group, *, step: int, group_size: int) -> int:
    """The group's staleness at ``step``: of its oldest model token (core.sample_staleness)."""
    ro = grp.rollout
    return int(st.sample_staleness(ro.versions, ro.loss_mask, step=step, group_size=group_size)[0])


def take_batch(next_group, *, count: int, step: int, max_staleness: int, group_size: int) -> Taken:
    """Groups from ``next_group()`` until ``count`` have a staleness of at most ``max_staleness`` at
    ``step``; the others are dropped."""
    out = Taken([], [], [])
    while len(out.kept) < count:
        grp = next_group()
        s = group_staleness(grp, step=step, group_size=group_size)
        (out.dropped if s > max_staleness else out.kept).append(grp)
        out.staleness.append(s)
    return out


def merged_stream(parts: list[dict]) -> dict:
    """One prompt stream from every process's (each: its ``first_draw``, the sampler position at its
    start, the (draw, group) pairs ``done`` from it on, and the groups of a draw that are ``mine``):
    from the oldest first draw, with the groups done anywhere; a process whose first draw is later
    trained or dropped all of its groups of the draws before it. The draws' pass rates ``observed``
    (alike everywhere) are joined."""
    oldest = min(parts, key=lambda p: p["first_draw"])
    first = oldest["first_draw"]
    done = {tuple(x) for p in parts for x in p["done"]}
    done |= {(d, i) for p in parts for d in range(first, p["first_draw"]) for i in p["mine"]}
    observed = {int(d): r for p in parts for d, r in p.get("observed", {}).items()}  # alike on every process
    return {"first_draw": first, "sampler": oldest["sampler"], "done": sorted(done), "observed": observed}


def get_or_raise(q: queue.Queue, failure, *, wait: float):
    """The next item of ``q``; once ``failure()`` returns an exception, the items queued before it first,
    then it raised."""
    while True:
        try:
            return q.get_nowait()
        except queue.Empty:
            pass
        if (err := failure()) is not None:
            raise err
        try:
            return q.get(timeout=wait)
        except queue.Empty:
            continue


def put_unless(q: queue.Queue, item, stopped, *, wait: float) -> None:
    """``item`` into ``q``, waiting for room, unless ``stopped()`` first."""
    while not stopped():
        try:
            q.put(item, timeout=wait)
            return
        except queue.Full:
            continue


@dataclass
class StreamPosition:
    """Where this process's prompt stream stands, what the checkpoint keeps: ``first`` the oldest draw
    with a group of this process not yet trained or dropped, ``start`` the sampler position at its
    start, ``done`` the (draw, index) pairs of draws >= first trained or dropped, ``observed`` the scored
    draws' pass rates (draw -> [B]) that draws from ``first`` on still hear of, and ``starts`` the sampler
    position at the start of each draw the running threads made. ``lag`` = K + 1: draw d hears of draw
    d - lag's pass rates."""

    first: int
    start: dict
    lag: int
    done: set = field(default_factory=set)
    observed: dict = field(default_factory=dict)
    starts: dict = field(default_factory=dict)

    def mark(self, pairs, mine: range) -> None:
        """Groups trained or dropped; the start moves past draws (already drawn) with none of ``mine`` left."""
        self.done.update(pairs)
        while self.first + 1 in self.starts and all((self.first, i) in self.done for i in mine):
            self.done = {x for x in self.done if x[0] != self.first}
            self.first += 1
            self.start = self.starts.pop(self.first)
        for d in [d for d in self.observed if d < self.first - self.lag]:
            del self.observed[d]

    def part(self, mine: range) -> dict:
        """This process's part of the checkpoint (merged_stream joins every process's): the pass rates of
        draws before ``first`` that the resumed draws hear of (not those of the draws made again)."""
        return {"first_draw": self.first, "sampler": self.start, "done": sorted(self.done), "mine": list(mine),
                "observed": {d: r for d, r in self.observed.items() if self.first - self.lag <= d < self.first}}

    def load(self, state: dict) -> None:
        self.first, self.start = state["first_draw"], state["sampler"]
        self.done = {tuple(x) for x in state["done"]}
        self.observed = {int(d): list(r) for d, r in state.get("observed", {}).items() if int(d) < self.first}


@dataclass(frozen=True)
class Share:
    """A process's contiguous share of the kept groups (sorted by draw and index), and how many of
    all the kept groups are used (a whole number of units: the rest is left out of the step)."""

    rows: list
    used: int


def kept_share(mine: list, *, n_kept: int, world: distributed.World, mini_batches: int) -> Share:
    """Every process's kept items (each sorted by its first two fields: draw and index) gathered, the
    first ``used`` of them kept, and this process's equal, contiguous share: whole mini-batches on every
    process when there are enough groups (then 1 and N processes take the same mini-batches,
    split.mini_batch_rows), else whole groups per process."""
    unit = world.size * mini_batches if n_kept >= world.size * mini_batches else world.size
    used = n_kept - n_kept % unit
    kept = sorted((x for part in distributed.gather_objects(mine, world) for x in part), key=lambda x: x[:2])[:used]
    return Share(kept[world.rank * used // world.size:(world.rank + 1) * used // world.size], used)


@dataclass
class Slot:
    """What one step trains: this process's groups, every (draw, index) pair of the slot's draws
    (trained by some process or dropped), and the synchronous step's metrics: the scoring figures of
    the draw that closed the slot (its last round's) and the dynamic-sampling ones."""

    step: int
    groups: list
    pairs: list[tuple[int, int]]
    metrics: dict
    seconds: float  # the sampling time of its draws


@dataclass(frozen=True)
class FillerAt:
    """Where the filling stands, read by the producer in one piece: the slot being filled (the step that
    trains it), the draws scored into it, and the draws scored since the filler started."""

    open: int
    drawn: int = 0
    scored: int = 0

    def latest_slot(self, made: int) -> int:
        """The latest slot a draw made now (the ``made``-th since the start) can land in: one per draw in
        flight, as each closes at most one slot."""
        return self.open + made - self.scored

    def key(self, made: int) -> tuple[int, int]:
        """(step, round) that keys a draw made now: the synchronous loop's round of step ``open`` when
        nothing is in flight (K = 0)."""
        return self.open, self.drawn + made - self.scored


@dataclass
class SlotFiller:
    """The scorer's side: fills slot ``at.open`` draw by draw. ``prompts`` = B, ``share`` = b."""

    prompts: int
    share: int
    rounds: int  # dynamic_sampling_rounds
    mini_batches: int
    world: distributed.World  # the scorers' processes
    at: FillerAt  # replaced whole, so the producer's thread reads a consistent one
    kept: list = field(default_factory=list)  # this process's kept groups: (draw, index, group)
    n_kept: int = 0  # over every process
    pairs: list = field(default_factory=list)
    seconds: float = 0.0  # the sampling time of the slot's draws so far

    def add(self, draw: int, groups: list, rewards: torch.Tensor, done) -> Slot | None:
        """A scored draw: ``groups`` this process's b groups (in the draw's order, the first at index
        rank * b), ``rewards`` [B, G] the whole draw's, ``done`` the (draw, index) pairs trained before
        a resume (never kept again). The slot, when this draw closes it."""
        informative = core.informative_groups(rewards)  # [B] bool
        free = torch.tensor([(draw, j) not in done for j in range(self.prompts)])  # [B]
        idx = (informative & free).nonzero().flatten()[: self.prompts - self.n_kept]  # [k] the draw's first
        first = self.world.rank * self.share
        for j in idx.tolist():
            if first <= j < first + self.share:
                grp = groups[j - first]
                if self.world.distributed:  # to move between processes: on the CPU, without objects of this one
                    ro = rollout_to(grp.rollout, "cpu")
                    grp = dataclasses.replace(grp, rollout=dataclasses.replace(ro, episodes=None if ro.episodes is None
                                              else [episode_counts(e) for e in ro.episodes]))
                self.kept.append((draw, j, grp))
        self.n_kept += len(idx)
        self.pairs += [(draw, j) for j in range(self.prompts)]
        self.seconds += groups[0].rollout.seconds  # each group's rollout carries its draw's
        at = self.at
        if self.n_kept < self.prompts and at.drawn + 1 < self.rounds:
            self.at = FillerAt(at.open, at.drawn + 1, at.scored + 1)
            return None
        share = kept_share(self.kept, n_kept=self.n_kept, world=self.world, mini_batches=self.mini_batches)
        metrics = {**groups[0].metrics, "dynamic_sampling_rounds": at.drawn + 1,  # the closing draw's scoring
                   "dynamic_sampling_dropped_share": 1.0 - share.used / ((at.drawn + 1) * self.prompts),
                   "dynamic_sampling_empty": int(share.used == 0), "trained_groups": share.used or self.prompts}
        rows = [x[2] for x in share.rows] if share.used else list(groups)  # none kept: the last draw as it is
        slot = Slot(at.open, rows, self.pairs, metrics, self.seconds)
        self.kept, self.n_kept, self.pairs, self.seconds = [], 0, [], 0.0
        self.at = FillerAt(at.open + 1, 0, at.scored + 1)
        return slot
