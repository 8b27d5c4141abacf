"""Reward workers: a pool of Ray actors that run the run's rewards (math, the code sandbox, judges, HTTP
rewards: every one found by name, as the grading service runs them) on blocks of a step's completions.

A worker sends back each completion's outcome (a value, or the exception that failed it) without judging
it; the trainer checks, counts and logs them exactly as it does its own (``score_completions``'s
``outcomes``), so a run's reward metrics do not depend on where its rewards ran. Rewards handed over as
objects (the Python API) and a reward model (which scores with the model the trainer holds) run in the
trainer, and so do batch-form rewards in runs whose episodes hold environment instances. Each worker
scores whole groups (a group-mode judge sees its group); a batch-form (TRL) reward sees its worker's
block of groups, not the whole step, and what it logs (``log_metric``, ``log_extra``) comes back.

A worker that dies mid-call is restarted by Ray (up to ``ray_max_restarts`` times) and its block is
scored again from the same inputs, so no completion is scored twice or lost; each restart is one warning
line and counts in ``cluster/reward_restarts``.
"""

from __future__ import annotations

import logging
import os
import pickle
import time

from grpo.cluster.faults import RESTART_WAIT, Hung, answer_after_restart, die_at, restarted
from grpo.errors import RewardError
from grpo.rollout.vllm.client import blocks

log = logging.getLogger("grpo.cluster")


def _portable(outcome):
    """An outcome that crosses to the trainer: an exception that cannot be pickled as a RuntimeError with its text."""
    if not isinstance(outcome, BaseException):
        return outcome
    try:
        pickle.loads(pickle.dumps(outcome))
        return outcome
    except Exception:  # noqa: BLE001 - any exception type of user code
        return RuntimeError(f"{type(outcome).__name__}: {outcome}")


class RewardWorker:
    """One reward worker (a Ray actor: launch.py applies ``ray.remote``): a RewardRunner per set of reward
    names, built on first use."""

    def __init__(self, index: int, working_dir: str):
        from grpo.infra.runtime import import_from

        import_from(working_dir)
        self.index, self.calls, self.runners = index, 0, {}

    def pid(self) -> int:
        return os.getpid()

    def outcomes(self, names: list[str], options, completions: list[str], samples: list[dict], extra: dict) -> dict:
        """Each named reward's outcome per completion, what they logged, and the deadlines they passed."""
        from grpo.rewards.runner import RewardRunner

        self.calls += 1
        die_at("reward", self.index, self.calls, restarted=restarted())
        key = (tuple(names), repr(options))
        if key not in self.runners:
            self.runners[key] = RewardRunner(list(names), None, options)
        runner = self.runners[key]
        before = runner.timeouts
        got = runner.outcomes(completions, samples, extra)
        got["outcomes"] = {n: [_portable(o) for o in v] for n, v in got["outcomes"].items()}
        return {**got, "timeouts": runner.timeouts - before}


def group_blocks(samples: list[dict], parts: int) -> list[list[int]]:
    """The rows in at most ``parts`` contiguous blocks of whole groups (a group: consecutive rows of one
    sample object, as the collector repeats a prompt's row for its completions), near-equal in groups."""
    starts = [r for r in range(len(samples)) if r == 0 or samples[r] is not samples[r - 1]]
    ends = starts[1:] + [len(samples)]
    groups = [list(range(a, b)) for a, b in zip(starts, ends)]
    return [[r for g in block for r in g] for block in blocks(groups, parts) if block]


def _rows(extra: dict, rows: list[int]) -> dict:
    """``extra``'s per-completion lists cut to ``rows``; an episode's environment instance stays here."""
    out = {k: [v[r] for r in rows] if isinstance(v, list) else v for k, v in extra.items()}
    if out.get("episodes") is not None:
        out["episodes"] = [{k: v for k, v in e.items() if k != "environment"} for e in out["episodes"]]
    return out


class RewardPool:
    """The trainer's side: a call's completions in contiguous blocks, one per worker, scored at once."""

    def __init__(self, workers: list, *, max_restarts: int, call_timeout: float):
        import ray

        self._ray, self.workers, self.max_restarts, self.call_timeout = ray, workers, max_restarts, call_timeout
        self.pids = ray.get([w.pid.remote() for w in workers], timeout=call_timeout)
        self.restarted: set[tuple[int, int]] = set()  # (worker, pid of its new process) this rank saw

    def outcomes(self, runner, completions: list[str], samples: list[dict], extra: dict) -> dict | None:
        """The outcomes of ``runner``'s pooled rewards (RewardRunner.pooled_names; batch-form ones stay in the
        trainer where episodes hold environment instances, which they may read) on every completion, each
        worker scoring whole groups, and what those rewards logged; None where none is pooled."""
        from ray.exceptions import GetTimeoutError, RayActorError

        envs = any(e.get("environment") is not None for e in extra.get("episodes") or [])
        names = [n for n in runner.pooled_names if not (envs and runner.fns[n].batch)]
        if not names or not completions:
            return None
        parts = dict(enumerate(group_blocks(samples, len(self.workers))))
        got: dict[int, dict] = {}
        for _ in range(self.max_restarts + 2):
            refs = {i: self.workers[i].outcomes.remote(names, runner.options, [completions[r] for r in rows],
                                                       [samples[r] for r in rows], _rows(extra, rows))
                    for i, rows in parts.items() if i not in got}
            t0 = time.monotonic()
            for i, ref in refs.items():  # a call's deadline: ray_call_timeout (the rewards keep their own inside)
                try:
                    try:
                        got[i] = self._ray.get(ref, timeout=max(self.call_timeout - (time.monotonic() - t0), 0.0))
                    except GetTimeoutError:  # hung: Ray restarts it once killed
                        self._ray.kill(self.workers[i], no_restart=False)
                        raise Hung(f"no answer within ray_call_timeout={self.call_timeout:g} s") from None
                except (RayActorError, Hung) as e:
                    self._restarted(i, e, len(parts[i]))
            if len(got) == len(parts):
                break
        else:
            raise RewardError(f"ray: reward worker(s) {sorted(set(parts) - set(got))} died more than "
                              f"ray_max_restarts={self.max_restarts} times")
        runner.timeouts += sum(g["timeouts"] for g in got.values())
        order = sorted(parts)
        logs = {"log_metrics": {}, "log_columns": {}}
        for i in order:
            for name, values in got[i]["log_metrics"].items():
                logs["log_metrics"].setdefault(name, []).extend(values)
        for name in {n for i in order for n in got[i]["log_columns"]}:  # one value per row: None where a block logged none
            logs["log_columns"][name] = [v for i in order for v in got[i]["log_columns"].get(name, [None] * len(parts[i]))]
        return {"outcomes": {n: [o for i in order for o in got[i]["outcomes"][n]] for n in names}, **logs}

    def _restarted(self, i: int, err: Exception, rows: int) -> None:
        from ray.exceptions import RayActorError

        old = self.pids[i]
        try:
            self.pids[i] = answer_after_restart(self.workers[i].pid.remote)
        except RayActorError:
            raise RewardError(f"ray: reward worker {i} (pid {old}) died and was not restarted within "
                              f"{RESTART_WAIT:g} s (ray_max_restarts={self.max_restarts})") from None
        self.restarted.add((i, self.pids[i]))
        log.warning("ray: reward worker %d (pid %s) died or hung while scoring (%s: %s); Ray restarted it as pid %s, which "
                    "scores its %d completions again", i, old, type(err).__name__, str(err)[:200], self.pids[i], rows)
