"""Running untrusted Python under bubblewrap: isolation by the kernel, not by Python blocklists.

Each run is one ``bwrap`` process tree:
- new user, PID, network, IPC, UTS and cgroup namespaces (``--unshare-all``): no network at all, and
  every descendant lives in a PID namespace whose init dies with the run (``--die-with-parent`` ties
  it to the ``bwrap`` the grader kills), so nothing the program forks can outlive its verdict;
- a fresh tmpfs root with only /usr (read-only) bound in, a private /tmp and a private writable work
  folder; host files outside /usr (the repository, /etc, /root, /work, ...) do not exist in there;
- as root (CI), each run gets its own unprivileged uid (61000..61255, claimed machine-wide with a lock
  file, so concurrent graders in other processes never share one), so the process limit applies
  and, after the run, every process of that uid is killed from the host;
- rlimits set by the trusted harness before any program code runs: CPU seconds, address space, file
  size (which also caps stdout/stderr: they are host files), open files and processes;
- a seccomp filter (grpo.rewards.seccomp_filter, handed to bwrap as ``--seccomp FD``): the system
  calls a graded program never needs (ptrace, bpf, keyctl, perf_event_open, userfaultfd, mounts, new
  namespaces, ...) kill the program at the first call;
- a wall-clock deadline per run; stdout and stderr are read back at most ``output_cap`` bytes.

If bubblewrap is missing or cannot create its namespaces, ``Sandbox.check()`` raises SandboxError
with what to do; nothing here ever runs a program without the sandbox.
"""

from __future__ import annotations

import fcntl
import os
import queue
import random
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from grpo.errors import SandboxError
from grpo.rewards.seccomp_filter import filter_bpf

HARNESS = Path(__file__).with_name("harness.py")
UID_BASE, UID_COUNT = 61000, 256  # sandbox uids (as root): one per concurrent run, machine-wide
LOCK_DIR = Path(tempfile.gettempdir()) / "grpo-sandbox-uids"
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: apt-get install -y bubblewrap; Fedora: dnf install "
                "bubblewrap; Arch: pacman -S bubblewrap) and allow user namespaces "
                "(sysctl kernel.unprivileged_userns_clone=1 where that switch exists; in Docker run with "
                "--security-opt seccomp=unconfined or as a privileged container)")



@dataclass
class RunResult:
    exit_code: int | None  # None when killed at the deadline
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool  # the output passed output_cap


def sandbox_python() -> str:
    """The interpreter inside the sandbox: a system Python under /usr (the only host folder bound in)."""
    env = os.environ.get("GRPO_SANDBOX_PYTHON")
    if env:
        return env
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(cand, os.X_OK):
            return cand
    raise SandboxError("code sandbox: no Python under /usr (/usr/bin/python3); install python3 or set "
                       "GRPO_SANDBOX_PYTHON to an interpreter under /usr")


def _uid_processes(uid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            if int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith("Z"):
                pids.append(int(entry))  # zombies are already dead: their parent reaps them
        except (OSError, ValueError, KeyError):
            continue
    return pids


def _claim_uid() -> tuple[int, int]:
    """A sandbox uid no other run on this machine holds (any process, any grader): an exclusive flock
    on its lock file, kept until the run ends. Returns (uid, the lock's file descriptor)."""
    LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
    start = random.randrange(UID_COUNT)
    while True:
        for k in range(UID_COUNT):
            uid = UID_BASE + (start + k) % UID_COUNT
            fd = os.open(LOCK_DIR / str(uid), os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return uid, fd
            except OSError:
                os.close(fd)
        time.sleep(0.05)  # all taken: wait for a run to end


def kill_uid(uid: int) -> None:
    """SIGKILL every process whose real uid is ``uid`` (a sandbox slot's; never a real user's)."""
    for _ in range(20):
        pids = _uid_processes(uid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)


class Sandbox:
    """A fixed number of concurrent bubblewrap slots; ``run`` blocks until a slot is free."""

    def __init__(self, *, slots: int = 4, memory_mb: int = 512, file_mb: int = 1, max_procs: int = 32,
                 max_files: int = 64, output_cap: int = 65536, scratch_mb: int = 16):
        self.memory_mb, self.file_mb, self.max_procs, self.max_files = memory_mb, file_mb, max_procs, max_files
        self.scratch_mb = scratch_mb  # size of each writable tmpfs (/work, /tmp)
        self.output_cap = output_cap
        self.as_root = os.geteuid() == 0
        self._slots: queue.Queue[int] = queue.Queue()
        for s in range(slots):
            self._slots.put(s)
        self._checked = False

    def _bwrap_argv(self, work: str, names: list[str], python: str, harness_dir: str,
                    args: list[str], seccomp_fd: int) -> list[str]:
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxError(f"code sandbox: bubblewrap (bwrap) is not installed; {INSTALL_HINT}")
        # Every writable place is a tmpfs of bounded size (tmpfs pages are host memory that RLIMIT_AS
        # does not count, and RLIMIT_FSIZE bounds one file, not many); /dev and the root are remounted
        # read-only last. The program's files are bound read-only into its /work.
        cap = str(self.scratch_mb << 20)
        argv = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
                "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
                "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin",
                "--proc", "/proc", "--dev", "/dev", "--size", str(1 << 20), "--tmpfs", "/dev/shm",
                "--size", cap, "--tmpfs", "/tmp", "--ro-bind", harness_dir, "/harness",
                "--size", cap, "--tmpfs", "/work"]
        for name in names:
            argv += ["--ro-bind", os.path.join(work, name), f"/work/{name}"]
        argv += ["--chdir", "/work", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/work",
                 "--hostname", "sandbox", "--remount-ro", "/dev", "--remount-ro", "/",
                "--seccomp", str(seccomp_fd)]
        if not self.as_root:
            argv += ["--unshare-user", "--uid", "65534", "--gid", "65534"]
        return argv + ["--", python, "-I", "-S", "-B", "/harness/harness.py", *args]

    def run(self, files: dict[str, str], args: list[str], *, stdin_data: str = "", stdin_path: str | None = None,
            timeout: float = 5.0, cpu_seconds: int | None = None) -> RunResult:
        """Run the harness with ``args`` in a fresh work folder holding ``files``; stdin is
        ``stdin_data`` (a pipe, read by the harness) or the host file ``stdin_path``."""
        slot = self._slots.get()
        uid, lock = _claim_uid() if self.as_root else (os.getuid(), None)
        tmp = tempfile.mkdtemp(prefix="grpo-sandbox-")
        try:
            work, harness_dir = os.path.join(tmp, "work"), os.path.join(tmp, "harness")
            os.mkdir(work, 0o700)
            os.mkdir(harness_dir, 0o755)
            shutil.copy(HARNESS, os.path.join(harness_dir, "harness.py"))
            for name, text in files.items():
                Path(work, name).write_text(text)
            limits = [str(cpu_seconds or int(timeout) + 1), str(self.memory_mb << 20), str(self.file_mb << 20),
                      str(self.max_files), str(self.max_procs)]
            bpf_path = os.path.join(tmp, "seccomp.bpf")
            Path(bpf_path).write_bytes(filter_bpf())
            if self.as_root:
                os.chmod(tmp, 0o711)
                for root, dirs, names in os.walk(work):
                    for n in dirs + names:
                        os.chown(os.path.join(root, n), uid, uid)
                os.chown(work, uid, uid)
            with open(bpf_path, "rb") as bpf:  # bwrap reads the filter from this descriptor
                argv = self._bwrap_argv(work, sorted(files), sandbox_python(), harness_dir, [*limits, *args],
                                        bpf.fileno())
                return self._spawn(argv, uid, tmp, stdin_data, stdin_path, timeout, bpf.fileno())
        finally:
            if self.as_root:
                kill_uid(uid)  # whatever escaped the PID namespace's teardown (nothing should)
                os.close(lock)  # releases the uid for the next run, in any process
            shutil.rmtree(tmp, ignore_errors=True)
            self._slots.put(slot)

    def _spawn(self, argv, uid, tmp, stdin_data, stdin_path, timeout, seccomp_fd) -> RunResult:
        out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        user = dict(user=uid, group=uid, extra_groups=[]) if self.as_root else {}
        with open(out_path, "wb") as out, open(err_path, "wb") as err, \
                (open(stdin_path, "rb") if stdin_path else open(os.devnull, "rb")) as inp:
            try:
                proc = subprocess.Popen(argv, stdin=inp if stdin_path else subprocess.PIPE, stdout=out, stderr=err,
                                        start_new_session=True, close_fds=True, pass_fds=(seccomp_fd,), **user)
            except OSError as e:  # bwrap found but not runnable (bad interpreter, a folder the uid cannot enter)
                raise SandboxError(f"code sandbox: {argv[0]} cannot be run ({type(e).__name__}: {e.strerror}); "
                                   f"{INSTALL_HINT}") from None
            timed_out = False
            try:
                if not stdin_path:
                    try:
                        proc.stdin.write(stdin_data.encode())
                        proc.stdin.close()
                    except OSError:
                        pass  # the harness died before reading: the run fails on its own
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                self._stop(proc, uid)
        stdout, t1 = _read_capped(out_path, self.output_cap)
        stderr, t2 = _read_capped(err_path, self.output_cap)
        return RunResult(None if timed_out else proc.returncode, stdout, stderr, timed_out, t1 or t2)

    def _stop(self, proc: subprocess.Popen, uid: int) -> None:
        """Kill the run's processes from the inside out, so bwrap exits on its own and is reaped here
        (killing bwrap first would orphan its namespace init to the host's init for a moment)."""
        if self.as_root:
            kill_uid(uid)
        try:
            proc.wait(2)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # bwrap dies; --die-with-parent takes its namespace along
        except OSError:
            pass
        proc.wait()

    def check(self) -> None:
        """Raise SandboxError unless a trivial program runs in the sandbox (result cached)."""
        if self._checked:
            return
        res = self.run({}, ["selftest"], timeout=30.0)
        if res.exit_code != 0 or res.stdout.strip() != "sandbox ok":
            raise SandboxError(f"code sandbox: bubblewrap could not start a sandbox (exit {res.exit_code}, "
                               f"stderr {res.stderr.strip()[:300]!r}); {INSTALL_HINT}")
        self._checked = True


def _read_capped(path: str, cap: int) -> tuple[str, bool]:
    with open(path, "rb") as f:
        data = f.read(cap + 1)
    return data[:cap].decode("utf-8", errors="replace"), len(data) > cap
