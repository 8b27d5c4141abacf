"""Faults on purpose, for the tests of a cluster run: ``$GRPO_RAY_KILL`` names a process that sends itself
SIGKILL (a real death, as the OOM killer's) at a set point, once: ``rollout:I:N`` rollout worker I during
its N-th sampling call, ``reward:I:N`` reward worker I during its N-th scoring call, ``trainer:R:S``
trainer rank R once step S's checkpoint is written (so during step S + 1; S = 0: once the first step is
logged, before a checkpoint where save_steps is larger). A restarted worker, and a run
restarted after a trainer's death, do not fire it again. ``hang-rollout:I:N`` and ``hang-reward:I:N``: the worker stops
answering instead of dying (a hung process; ray_call_timeout). Unset (every real run), nothing happens."""

from __future__ import annotations

import os
import signal
import warnings

ENV = "GRPO_RAY_KILL"


def planned(role: str, index: int) -> int | None:
    """The call (or step) at which ``role`` ``index`` is to die, or None."""
    spec = os.environ.get(ENV, "")
    for part in filter(None, spec.split(",")):
        r, i, n = part.split(":")
        if r == role and int(i) == index:
            return int(n)
    return None


def die_at(role: str, index: int, count: int, *, restarted: bool) -> None:
    """SIGKILL this process when it is ``role`` ``index`` at its planned ``count`` (and not restarted); with
    the role ``hang-<role>`` in the plan, stop answering instead (a hung worker: sleep until killed)."""
    if restarted:
        return
    if planned(role, index) == count:
        os.kill(os.getpid(), signal.SIGKILL)
    if planned(f"hang-{role}", index) == count:
        import time

        time.sleep(10**6)


def restarted() -> bool:
    """Whether this Ray actor's process is a restart of one that died."""
    import ray

    with warnings.catch_warnings():  # Ray 2.60 warns about an attribute it reads inside
        warnings.simplefilter("ignore", DeprecationWarning)
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)


RESTART_WAIT = 60.0  # seconds an actor that died may take to answer again before it counts as gone


def answer_after_restart(call):
    """``ray.get(call())`` of an actor that just died: asked again until Ray has restarted it (a call made
    while its death is being handled fails too), for at most RESTART_WAIT seconds; then RayActorError."""
    import time

    import ray
    from ray.exceptions import RayActorError

    deadline = time.monotonic() + RESTART_WAIT
    while True:
        try:
            return ray.get(call(), timeout=RESTART_WAIT)
        except (RayActorError, ray.exceptions.GetTimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


class Hung(Exception):
    """A worker that did not answer a call within its deadline (ray_call_timeout); it has been killed."""
