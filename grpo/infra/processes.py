"""Child processes that die with the trainer.

Every process grpo starts (reward workers, math-verify workers) calls ``die_with_parent`` first, so a
trainer killed outright (SIGKILL, the OOM killer) leaves none of them behind: no ``atexit`` or
``finally`` runs in a killed process, and a worker blocked on its own queue never sees the trainer go.
Multiprocessing's resource tracker exits by itself once every holder of its pipe (the trainer and
the pool's workers) is gone. The code sandbox's ``bwrap`` runs with ``--die-with-parent``, which
sets the same signal in bwrap itself and in the sandbox's init.
"""

from __future__ import annotations

import os
import signal

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when the thread that started it ends (Linux
    PR_SET_PDEATHSIG; elsewhere a no-op). The signal follows the starting *thread*, so start children
    from a thread that lives as long as they should. ``parent_pid`` is the starter's pid: a starter
    that was already gone before the call took effect would never send the signal, so then exit now."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    except (OSError, AttributeError):  # no prctl: not Linux
        return
    if os.getppid() != parent_pid:
        os._exit(1)
