"""The seccomp filter every sandboxed program runs under (grpo.rewards.sandbox hands it to bubblewrap
with ``--seccomp FD``): the system calls a graded program never needs kill its whole process at the
first call (SIGSYS), before the kernel acts on them. Built with libseccomp's bindings (``pyseccomp``),
which give the BPF program for this machine's architecture; system calls of another ABI on it (32-bit
calls on x86-64) are killed too, as libseccomp does by default for architectures not in the filter.

What is refused, and why a test program never needs it:
- tracing and reading other processes: ptrace, process_vm_readv/writev, kcmp, pidfd_getfd;
- kernel objects with their own privileges: bpf, perf_event_open, userfaultfd, keyctl, add_key,
  request_key, io_uring_*;
- namespaces and mounts (the sandbox made its own; a program making more could reach kernel code
  that is otherwise unprivileged-unreachable): unshare, setns, mount and the new mount API, umount2,
  pivot_root, chroot, and clone with any CLONE_NEW* flag;
- the machine's state: modules, kexec, reboot, swap, accounting, quotas, clocks, the kernel log,
  I/O ports, file handles.
clone3 answers ENOSYS instead (its flags sit in a struct a filter cannot read): the C library then
creates threads and processes with clone, whose flags the filter checks.
"""

from __future__ import annotations

import errno
import functools
import tempfile

from grpo.errors import SandboxError

KILLED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick",
    "move_mount", "open_tree", "mount_setattr",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot", "swapon",
    "swapoff", "acct", "quotactl", "quotactl_fd", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "syslog", "iopl", "ioperm", "open_by_handle_at", "name_to_handle_at", "lookup_dcookie", "fanotify_init",
)
# clone's flags (its first argument on x86-64 and arm64) that make a namespace
CLONE_NEW = {"CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
             "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
             "CLONE_NEWNET": 0x40000000}
INSTALL = ("the code sandbox's seccomp filter needs libseccomp and its Python bindings: pip install "
           "'pyseccomp>=0.1.2,<0.2' (in grpo's dependencies) and, where missing, apt-get install libseccomp2")

@functools.cache  # a per-process cache: the filter depends only on this machine's architecture
def filter_bpf() -> bytes:
    """The compiled filter (BPF) for this machine, built once per process; SandboxError when
    libseccomp cannot build it (the sandbox then refuses to run anything)."""
    try:
        import pyseccomp as sc
    except (ImportError, RuntimeError, OSError) as e:  # no binding, or no libseccomp under it
        raise SandboxError(f"code sandbox: {INSTALL} ({type(e).__name__}: {e})") from None
    f = sc.SyscallFilter(defaction=sc.ALLOW)
    for name in KILLED:
        try:
            nr = sc.resolve_syscall(sc.Arch.NATIVE, name)
        except Exception:  # a call this architecture does not have
            continue
        if nr >= 0:
            f.add_rule(sc.KILL_PROCESS, nr)
    for flag in CLONE_NEW.values():
        f.add_rule(sc.KILL_PROCESS, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()
