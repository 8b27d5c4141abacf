"""Request batching: one worker thread per served model takes the waiting requests (up to
``max_batch``, those that arrived within ``window_s`` of the first) and decodes them as one batch.

The queue is bounded: a request that finds it full is refused (``Overloaded``: the server answers
429) instead of waiting without bound. A request whose deadline passed while it waited is answered
'deadline' without decoding; a row whose deadline passes mid-batch is answered the moment the
engine's stopper sees it (its future resolves then, the rest of the batch decodes on). A batch that
raises fails only its own requests; the worker keeps serving.

A batcher can yield to another (``yield_to``): between two of its tokens it waits while the other
has requests waiting or decoding that can still make their deadline (never past the latest of
those deadlines: a GRPO request already answered 'deadline' is not waited for). The fallback yields
to the GRPO model: on a CPU both models share
the same cores, and a fallback decoding up to 1024 tokens beside the GRPO model would slow every
GRPO answer past its deadline (seed 003 section 5.3 gives the GRPO model a 0.8 s budget and the
fallback none); only one model's products then run at a time, so the two workers' thread pools do
not oversubscribe the cores either.
"""

from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

from grpo.serve.engines import Generation, RowStopper, ServeEngine


class Overloaded(Exception):
    """The queue is full (or the batcher stopped): the request is refused."""


@dataclass
class Job:
    prompt: str
    cap: int
    deadline: float | None  # time.monotonic() deadline
    temperature: float
    top_p: float
    future: Future = field(default_factory=Future)

    @property
    def sampling(self) -> tuple[float, float]:
        return (self.temperature, self.top_p)


def resolve(future: Future, result: Generation | None = None, error: BaseException | None = None) -> None:
    """Set a future once; later attempts (a deadline already answered, a caller that gave up) do nothing."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass


class Batcher:
    """A worker thread and a bounded queue in front of one ServeEngine."""

    def __init__(self, engine: ServeEngine, *, max_batch: int = 8, max_queue: int = 64, window_s: float = 0.005,
                 entropy_threshold: float = 0.0, entropy_run: int = 0, yield_to: "Batcher | None" = None):
        self.engine, self.max_batch, self.max_queue, self.window_s = engine, max_batch, max_queue, window_s
        self.entropy_threshold, self.entropy_run = entropy_threshold, entropy_run
        self.pending: collections.deque[Job] = collections.deque()
        self.cond = threading.Condition()
        self.running = 0  # rows in the batch being decoded
        self.current: list[Job] = []  # that batch
        self.stopping = False
        self.batches = 0
        self.yield_to = yield_to
        self.idle = threading.Event()  # set while nothing waits or decodes (what a yielding batcher waits for)
        self.idle.set()
        self.thread = threading.Thread(target=self._loop, name=f"serve-{engine.name}", daemon=True)
        self.thread.start()

    def depth(self) -> int:
        """Requests waiting or being decoded."""
        return len(self.pending) + self.running

    def busy_until(self) -> float | None:
        """The latest deadline (time.monotonic(); inf: a job without one) of the requests waiting or
        decoding whose answer is still awaited; None when there are none."""
        with self.cond:
            jobs = [j for j in (*self.pending, *self.current) if not j.future.done()]
        if not jobs:
            return None
        return max(float("inf") if j.deadline is None else j.deadline for j in jobs)

    def wait_for(self, other: "Batcher") -> None:
        """Wait while ``other`` has work that can still make its deadline (the yield, between tokens)."""
        while (until := other.busy_until()) is not None:
            left = until - time.monotonic()
            if left <= 0 or other.idle.wait(min(left, 1.0)):
                return

    def submit(self, prompt: str, *, cap: int, deadline: float | None, temperature: float = 0.0,
               top_p: float = 1.0) -> Future:
        job = Job(prompt, cap, deadline, temperature, top_p)
        with self.cond:
            if self.stopping:
                raise Overloaded("the server is shutting down")
            if len(self.pending) >= self.max_queue:
                raise Overloaded(f"{len(self.pending)} requests already wait (--max-queue {self.max_queue})")
            self.pending.append(job)
            self.idle.clear()
            self.cond.notify()
        return job.future

    def stop(self) -> None:
        """Finish what is queued, then end the worker."""
        with self.cond:
            self.stopping = True
            self.cond.notify()
        self.thread.join(timeout=60)
        self.idle.set()  # a batcher yielding to this one goes on

    def _take(self) -> list[Job] | None:
        with self.cond:
            while not self.pending and not self.stopping:
                self.cond.wait()
            if not self.pending:
                self.idle.set()
                return None
            until = time.monotonic() + self.window_s
            while len(self.pending) < self.max_batch and not self.stopping:
                left = until - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            key, batch, rest = self.pending[0].sampling, [], collections.deque()
            while self.pending:
                job = self.pending.popleft()
                (batch if job.sampling == key and len(batch) < self.max_batch else rest).append(job)
            self.pending = rest
            self.running, self.current = len(batch), batch
            return batch

    def _loop(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            try:
                self._run(batch)
            except BaseException as e:  # one failing batch answers its own requests with the error
                for job in batch:
                    resolve(job.future, error=e)
            finally:
                with self.cond:
                    self.running, self.current = 0, []
                    if not self.pending:
                        self.idle.set()

    def _run(self, batch: list[Job]) -> None:
        now = time.monotonic()
        live = []
        for job in batch:
            if job.future.done():  # the caller gave up
                continue
            if job.deadline is not None and job.deadline <= now:
                resolve(job.future, Generation("", 0, "deadline", 0.0))
            else:
                live.append(job)
        if not live:
            return
        stopper = RowStopper([j.cap for j in live], [j.deadline for j in live], eos=self.engine.eos,
                             entropy_threshold=self.entropy_threshold, entropy_run=self.entropy_run,
                             on_deadline=lambda row: resolve(live[row].future, Generation("", 0, "deadline", 0.0)),
                             pause=(lambda: self.wait_for(self.yield_to)) if self.yield_to is not None else None)
        self.batches += 1
        gens = self.engine.decode([j.prompt for j in live], stopper=stopper, temperature=live[0].temperature,
                                  top_p=live[0].top_p)
        for job, gen in zip(live, gens):
            resolve(job.future, gen)
