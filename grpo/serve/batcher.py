"""Request scheduling: one thread drives the engines of every served model.

A ``Lane`` is one model's requests: a bounded queue in front of its engine (a request that finds the
queue full is refused, ``Overloaded``: the server answers 429) and at most ``max_rows`` of its rows
decoding at once. The ``Scheduler``'s one thread admits waiting requests into their engine at every
step (continuous batching: a request that arrives while others decode joins at the next step), the
lanes in priority order (the GRPO model's first), and runs one engine step at a time:

- the GRPO model's engine steps whenever it has rows;
- the fallback's engine steps when the GRPO model has none, and otherwise only every other step and
  only while each GRPO row that can still meet its deadline would still meet it with the fallback
  taking every other step: estimated from both engines' measured step times and the length of the
  GRPO model's recent complete answers. A GRPO row that cannot meet its deadline even alone is not
  waited for. A GRPO request that arrives during a fallback step waits for that one step at most.

One thread runs every product, so the two models never compute at once and their thread pools do not
oversubscribe the cores (on a CPU both models share them; seed 003 section 5.3 gives the GRPO model a
0.8 s budget and the fallback none). Two lanes on one engine (the fallback is the served model
itself) share its steps, the GRPO lane admitted first.
"""

from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import Future

from grpo.serve.engines import Generation, Job, ServeEngine, resolve

DEFAULT_EXPECTED_TOKENS = 16  # a GRPO answer's length until complete answers were seen


class Overloaded(Exception):
    """The queue is full (or the server is stopping): the request is refused."""


class Lane:
    """One served model's requests (module docstring); ``submit`` needs the lane in a Scheduler."""

    def __init__(self, engine: ServeEngine, *, name: str = "grpo", max_rows: int = 8, max_queue: int = 64,
                 entropy_threshold: float = 0.0, entropy_run: int = 0):
        self.engine, self.name, self.max_rows, self.max_queue = engine, name, max_rows, max_queue
        self.entropy_threshold, self.entropy_run = entropy_threshold, entropy_run
        self.pending: collections.deque[Job] = collections.deque()
        self.running = 0  # its rows in the engine
        self.lengths: collections.deque[int] = collections.deque(maxlen=64)  # tokens of recent complete answers
        self.scheduler: Scheduler | None = None

    def submit(self, prompt: str | list[int], *, cap: int, deadline: float | None, temperature: float = 0.0,
               top_p: float = 1.0, on_tokens=None, top_logprobs: int | None = None) -> Future:
        job = Job(prompt, cap, deadline, temperature, top_p, self.entropy_threshold, self.entropy_run, on_tokens,
                  lane=self, top_logprobs=top_logprobs)
        sched = self.scheduler
        with sched.cond:
            if sched.stopping:
                raise Overloaded("the server is shutting down")
            if len(self.pending) >= self.max_queue:
                raise Overloaded(f"{len(self.pending)} requests already wait (--max-queue {self.max_queue})")
            self.pending.append(job)
            sched.cond.notify()
        return job.future

    def depth(self) -> int:
        """Requests waiting or being decoded."""
        return len(self.pending) + self.running

    def record_length(self, tokens: int) -> None:
        self.lengths.append(tokens)

    def expected_tokens(self) -> int:
        """The 90th percentile of its recent complete answers' lengths (the scheduler's estimate)."""
        if not self.lengths:
            return DEFAULT_EXPECTED_TOKENS
        s = sorted(self.lengths)
        return s[min(len(s) - 1, int(0.9 * len(s)))]


class Scheduler:
    """The thread that admits and steps (module docstring); ``lanes`` in priority order."""

    def __init__(self, lanes: list[Lane]):
        self.lanes = lanes
        self.engines = list(dict.fromkeys(lane.engine for lane in lanes))
        for lane in lanes:
            lane.scheduler = self
        self.cond = threading.Condition()
        self.stopping = False
        self.last: ServeEngine | None = None
        self.thread = threading.Thread(target=self._loop, name="serve-scheduler", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Finish the requests waiting and decoding, then end the thread."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.thread.join(timeout=60)

    def _work(self) -> bool:
        return any(lane.pending for lane in self.lanes) or any(e.rows for e in self.engines)

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self._work() and not self.stopping:
                    self.cond.wait()
                if not self._work():
                    return
                self._admit()
            for e in self.engines:
                e.drop_late()
            engine = self._pick()
            if engine is not None:
                engine.step()
                self.last = engine
            for lane in self.lanes:
                lane.running = sum(1 for r in lane.engine.rows if r.job.lane is lane)

    def _admit(self) -> None:
        now = time.monotonic()
        for lane in self.lanes:
            while lane.pending and lane.running < lane.max_rows:
                job = lane.pending[0]
                if job.future.done():  # the caller gave up
                    lane.pending.popleft()
                    continue
                if job.deadline is not None and job.deadline <= now:
                    lane.pending.popleft()
                    resolve(job.future, Generation("", 0, "deadline", 0.0))
                    continue
                if not lane.engine.can_admit(job):
                    break
                lane.pending.popleft()
                lane.engine.admit(job)
                lane.running += 1

    def _pick(self) -> ServeEngine | None:
        busy = [e for e in self.engines if e.rows]
        if len(busy) < 2:
            return busy[0] if busy else None
        first, other = busy[0], busy[1]
        if first is self.engines[0] and self.last is first and self.fallback_fits(first, other):
            return other
        return first

    def fallback_fits(self, grpo: ServeEngine, fallback: ServeEngine, now: float | None = None) -> bool:
        """Whether every GRPO row that can meet its deadline alone still can with ``fallback`` taking
        every other step from now on."""
        now = time.monotonic() if now is None else now
        tg, tf = grpo.step_seconds or 0.05, fallback.step_seconds or 0.05
        expect = self.lanes[0].expected_tokens()
        chunk = getattr(grpo, "max_step_tokens", 1 << 30)
        for row in grpo.rows:
            if row.job.deadline is None:
                continue
            steps, left = row.steps_left(expect, chunk), row.job.deadline - now
            if steps * tg <= left < steps * (tg + tf):
                return False
        return True
