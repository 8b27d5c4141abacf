"""Rewards under a wall-clock deadline, in worker processes.

A reward is user code: it can hang (a regex blow-up, a verifier stuck in simplification) as easily as
it can raise. With ``timeout > 0`` every call runs in a small pool of spawned worker processes; a
call that passes its deadline is a failure for that sample (counted, logged), and the stuck worker
is killed and the pool replaced, so the next sample is graded as usual. Only the name of the reward
and the (completion, sample) pair cross the process boundary; the value comes back pickled and is
validated in the trainer's process.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
from concurrent.futures.process import BrokenProcessPool

from grpo.errors import RewardError
from grpo.infra.processes import die_with_parent
from grpo.rewards.builtin import resolve_reward, user_reward
from grpo.rewards.forms import BatchInputs
from grpo.rewards.remote import AsyncReward, HttpReward
from grpo.rewards.reward import Reward, RewardOptions
from grpo.rewards.reward_model import RewardModelReward
from grpo.rewards.scoring import RewardResult, reward_outcomes, score_completions


STARTUP_TIMEOUT = 300.0  # seconds a fresh worker may take to import the rewards (not a reward's deadline)


def _call(name: str, completion: str, sample: dict):
    return resolve_reward(name)(completion, sample)


def _warm(names: list[str], extra: tuple = ()) -> None:
    for name in names:
        resolve_reward(name)
    for fn, args in extra:  # what else the workers call, imported before the first deadline runs
        fn(*args)


class RewardRunner:
    """Scores completions with named rewards, in-process (``options.timeout`` 0) or in
    ``options.workers`` worker processes with a deadline. ``given``: name -> callable for rewards handed
    over as objects (the Python API), which are not looked up by name and run in this process (a worker
    could not find them by name). ``fns``: name -> the resolved Reward, whose declarations say where
    each runs."""

    def __init__(self, names: list[str], weights: list[float] | None, options: RewardOptions, *,
                 given: dict | None = None, warm: tuple = ()):
        self.names, self.weights, self.options = names, weights, options
        self.timeout, self.workers = options.timeout, options.workers
        self.given = dict(given or {})
        self.warm = tuple(warm)  # (module-level fn, args) each new worker calls at start-up, outside the deadline
        # fail early, in this process, on a bad name; async and URL rewards keep their own deadline here
        self.fns: dict[str, Reward] = {n: user_reward(n, self.given[n], options) if n in self.given else
                                       resolve_reward(n, options) for n in names}
        self._remote = [r.fn for r in self.fns.values() if isinstance(r.fn, (AsyncReward, HttpReward))]
        self.logged: set = set()
        self.timeouts = 0
        self._pool: cf.ProcessPoolExecutor | None = None
        self.pool = None  # a cluster's reward workers (grpo/cluster/rewards.RewardPool), which run pooled_names

    def reward_model(self) -> RewardModelReward | None:
        """The ``reward_model`` reward's model holder among this runner's rewards (None: not used), so a
        run that trains the reward model scores with the model it trains."""
        found = [r.fn for r in self.fns.values() if isinstance(r.fn, RewardModelReward)]
        return found[0] if found else None

    def _new_pool(self) -> cf.ProcessPoolExecutor:
        # spawn, not fork: the trainer's process holds torch's thread pools, which a fork can deadlock.
        # The workers die with the trainer; they hold the write end of multiprocessing's resource
        # tracker pipe, so with them gone the tracker sees EOF and exits too.
        pool = cf.ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"), initializer=die_with_parent,
                                      initargs=(os.getpid(),))
        # a fresh worker imports the package (seconds on a busy host) before its first call: that
        # start-up is waited for here, outside every reward's deadline, or a deadline shorter than the
        # start-up would fail every call and kill every new pool, for ever
        try:
            for fut in [pool.submit(_warm, self._worker_names, self.warm) for _ in range(self.workers)]:
                fut.result(timeout=STARTUP_TIMEOUT)
        except BaseException as e:  # a worker that hangs, dies or fails while importing: the pool goes too
            self._pool = pool
            self._kill_pool()
            if isinstance(e, cf.TimeoutError):
                why = f"did not import the rewards ({', '.join(self._worker_names)}) within {STARTUP_TIMEOUT:.0f} s"
            elif isinstance(e, BrokenProcessPool):
                why = f"died while importing the rewards ({', '.join(self._worker_names)})"
            else:
                raise
            raise RewardError(f"reward_workers: {self.workers} worker process(es) {why}; is the machine overloaded "
                              f"or a reward module slow or broken on import? (reward_timeout=0 scores in this "
                              f"process)") from None
        return pool

    def _kill_pool(self) -> None:
        if self._pool is not None:
            for p in list(getattr(self._pool, "_processes", {}).values()):
                p.kill()
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    @property
    def _worker_names(self) -> list[str]:
        """Rewards run in workers; batch-form ones (a reward model on the trainer's device, the code
        sandbox, TRL-form functions), those that enforce their own deadline in their own processes
        (math-verify) and callables handed over in-process (``given``) run here."""
        return [n for n in self.names if n not in self.given and not self.fns[n].batch and not self.fns[n].own_deadline]

    @property
    def pooled_names(self) -> list[str]:
        """The rewards a cluster's reward workers can run (``pool``): every one found by name but a reward
        model, which scores with the model the trainer holds."""
        return [n for n in self.names if n not in self.given and not isinstance(self.fns[n].fn, RewardModelReward)]

    def run_in_workers(self, completions: list[str], samples: list[dict], names: list[str], *, call=_call) -> list:
        """Each (name, completion, sample)'s ``call`` in the worker processes under the deadline: its value, or
        the exception that failed it (``call``: a module-level function a worker imports; a step reward's
        too, rewards/steps.py)."""
        calls = [(n, c, s) for n in names for c, s in zip(completions, samples)]
        results: list = [None] * len(calls)
        i = 0
        while i < len(calls):
            self._pool = self._pool or self._new_pool()
            futures = [self._pool.submit(call, *args) for args in calls[i:]]
            for j, fut in enumerate(futures):
                key = i + j
                try:
                    results[key] = fut.result(timeout=self.timeout)
                except cf.TimeoutError:
                    results[key] = TimeoutError(f"did not return within its {self.timeout:g} s deadline")
                    self.timeouts += 1
                    self._kill_pool()  # the stuck worker dies; the rest are resubmitted to a fresh pool
                    i += j + 1
                    break
                except cf.process.BrokenProcessPool as e:  # a reward killed its worker (os._exit, a signal)
                    results[key] = RuntimeError(f"its worker process died ({e})")
                    self._kill_pool()
                    i += j + 1
                    break
                except Exception as e:  # raised inside the reward
                    results[key] = e
            else:
                i = len(calls)
        return results

    def score(self, completions: list[str], samples: list[dict], *, episodes: list[dict] | None = None,
              completion_ids: list[list[int]] | None = None, trainer_state=None) -> RewardResult:
        """``score_completions`` with this runner's rewards (the keywords: what TRL-form rewards also get);
        with a ``pool`` (a cluster's reward workers) the rewards it can run run there."""
        before = sum(f.timeouts for f in self._remote)
        extra = dict(episodes=episodes, completion_ids=completion_ids, trainer_state=trainer_state)
        try:
            pooled = None if self.pool is None else self.pool.outcomes(self, completions, samples, extra)
            done = {} if pooled is None else dict(pooled["outcomes"])
            done.update(self._in_workers([n for n in self.names if n not in done], completions, samples, extra))
            result = score_completions(completions, samples, self.fns, self.weights, logged=self.logged,
                                       outcomes=done, **extra)
            for key in ("log_metrics", "log_columns") if pooled else ():  # what the pooled rewards logged there
                for name, values in pooled[key].items():
                    getattr(result, key).setdefault(name, []).extend(values)
            return result
        finally:  # async calls and HTTP requests past their deadline count as the workers' do
            self.timeouts += sum(f.timeouts for f in self._remote) - before

    def _in_workers(self, names: list[str], completions: list[str], samples: list[dict], extra: dict) -> dict:
        """The outcomes of those of ``names`` that run in worker processes under reward_timeout ({} without one)."""
        names = [n for n in names if n in self._worker_names]
        if self.timeout <= 0 or not names:
            return {}
        rows = BatchInputs(completions, samples, episodes=extra["episodes"]).rows()  # what a worker's reward gets
        results = self.run_in_workers(completions, rows, names)
        n = len(completions)
        return {name: results[k * n:(k + 1) * n] for k, name in enumerate(names)}

    def outcomes(self, completions: list[str], samples: list[dict], extra: dict) -> dict:
        """Every reward's outcome per completion (a value, or the exception that failed it), run as ``score``
        runs it (worker processes and deadlines included) but not yet checked or counted, and what TRL-form
        rewards logged (``log_metrics``, ``log_columns``): what a cluster's reward worker sends back. The
        keywords of ``extra``: ``score``'s."""
        before = sum(f.timeouts for f in self._remote)
        try:
            done = self._in_workers(self.names, completions, samples, extra)
            inputs = BatchInputs(list(completions), samples, **extra)
            values = {n: done[n] if n in done else reward_outcomes(n, self.fns[n], inputs) for n in self.names}
            return {"outcomes": values, "log_metrics": inputs.log.metrics, "log_columns": inputs.log.columns}
        finally:
            self.timeouts += sum(f.timeouts for f in self._remote) - before

    def state_dict(self) -> dict:
        """What a resumed run needs to log and count as the uninterrupted one would: the failures
        already logged once, and the timeouts so far."""
        return {"logged_failures": sorted(self.logged), "reward_timeouts": self.timeouts}

    def load_state_dict(self, state: dict) -> None:
        self.logged = {tuple(k) for k in state["logged_failures"]}
        self.timeouts = state["reward_timeouts"]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
