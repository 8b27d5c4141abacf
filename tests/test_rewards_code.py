"""grpo.rewards.code: sandboxed code rewards. Hostile programs score 0 and leave the host as it was."""

import hashlib
import os
import shutil
import socket
import time
from pathlib import Path

import pytest

from grpo.rewards import resolve_reward
from grpo.rewards.code import CodeGrader, extract_code, plan_assert, program_parses
from grpo.rewards.code_rewards import check_code_sandbox, code_reward
from grpo.rewards.forms import is_batch_reward
from grpo.errors import SandboxError
from grpo.rewards.sandbox import UID_BASE, UID_COUNT
from tests.conftest import need_bwrap, needs_bwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLOTS = 2
ASSERTS = {"tests": ["assert f(2) == 4", "assert f(5) == 10"]}
IO = {"io": [{"input": "2\n", "output": "4\n"}, {"input": "7\n", "output": "14\n"}]}
IO_TWO_LINES = {"io": [{"input": "3\n", "output": "6\n9\n"}]}
GOOD_ASSERT = "```python\ndef f(x):\n    return 2 * x\n```"
GOOD_IO = "```python\nprint(int(input()) * 2)\n```"
WRONG = "def f(x):\n    return -1\n"

HOSTILE = {
    "infinite loop in the function": ("def f(x):\n    while True:\n        pass\n", ASSERTS),
    "sleep at import": ("import time\ntime.sleep(10**6)\n" + WRONG, ASSERTS),
    "ignores SIGTERM and SIGINT": ("import signal\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
                                   "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass\n", ASSERTS),
    "fork storm": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n", ASSERTS),
    "memory flood": ("a = []\nwhile True:\n    a.append(bytearray(10**7))\n", ASSERTS),
    "one huge allocation": ("x = bytearray(10**11)\ndef f(x):\n    return 2 * x\n", ASSERTS),
    "output flood": ("while True:\n    print('x' * 10000)\n", IO),
    "file flood in the work folder": ("open('big', 'wb').write(b'x' * 10**9)\ndef f(x):\n    return 2 * x\n", ASSERTS),
    "writes /etc/passwd": ("try:\n    open('/etc/passwd', 'a').write('evil::0:0::/:/bin/sh\\n')\n    ok = True\n"
                           "except Exception:\n    ok = False\ndef f(x):\n    return 2 * x if ok else -1\n", ASSERTS),
    "reads the repository": (f"import os\nok = os.path.exists({REPO + '/pyproject.toml'!r})\n"
                             "def f(x):\n    return 2 * x if ok else -1\n", ASSERTS),
    "reads /etc/shadow": ("try:\n    open('/etc/shadow').read()\n    ok = True\nexcept Exception:\n    ok = False\n"
                          "def f(x):\n    return 2 * x if ok else -1\n", ASSERTS),
    "network connection": ("import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=1)\n    ok = True\n"
                           "except Exception:\n    ok = False\ndef f(x):\n    return 2 * x if ok else -1\n", ASSERTS),
    "kills its parent and everything": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"
                                        "os.kill(-1, signal.SIGKILL)\n" + WRONG, ASSERTS),
    "os._exit(0) before the tests": ("import os\nos._exit(0)\n", ASSERTS),
    "sys.exit(0) before the tests": ("import sys\nsys.exit(0)\n", ASSERTS),
    "sys.exit(0) in io mode": ("import sys\nsys.exit(0)\n", IO),
    "SystemExit raised inside the function": ("def f(x):\n    raise SystemExit(0)\n", ASSERTS),
    "object equal to anything": ("class A:\n    def __eq__(self, o):\n        return True\n    def __ne__(self, o):\n"
                                 "        return False\n    __hash__ = object.__hash__\ndef f(x):\n    return A()\n", ASSERTS),
    "int subclass equal to anything": ("class I(int):\n    def __eq__(self, o):\n        return True\n"
                                       "    __hash__ = int.__hash__\ndef f(x):\n    return I(0)\n", ASSERTS),
    "truthy object for a bare assert": ("class T:\n    def __bool__(self):\n        return True\n"
                                        "def is_even(x):\n    return T()\n", {"tests": ["assert is_even(3)"]}),
    "prints only the first expected line": ("print(int(input()) * 2)\n", IO_TWO_LINES),
    "prints two answers": ("n = int(input())\nprint(n * 2)\nprint(n * 3)\n", IO),
    "patches builtins": ("import builtins\nbuiltins.repr = lambda x: '[4, 4]'\nbuiltins.type = lambda x: int\n"
                         "builtins.print = lambda *a, **k: None\ndef f(x):\n    return None\n", ASSERTS),
    "patches AssertionError and sys.exit": ("import builtins, sys\nbuiltins.AssertionError = type('X', (Exception,), {})\n"
                                            "sys.exit = lambda *a: None\nimport os\nos._exit = lambda *a: None\n" + WRONG,
                                            ASSERTS),
    "forges a result line and exits": ("import os\nprint('0' * 32 + ' [4, 4]')\nos.write(1, b'deadbeef [10, 10]\\n')\n"
                                       "os._exit(0)\n", ASSERTS),
    "reads the harness spec from stdin": ("import sys\nspec = sys.stdin.read()\ndef f(x):\n    return 2 * x if 'nonce' in spec else -1\n",
                                          ASSERTS),
    "closes stdout": ("import os\nos.close(1)\nos.close(2)\n" + WRONG, ASSERTS),
    "daemon that outlives the run": ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                                     "        time.sleep(1000)\n    os._exit(0)\n" + WRONG, ASSERTS),
    "background subprocess": ("import subprocess\nsubprocess.Popen(['sleep', '1000'])\n" + WRONG, ASSERTS),
    "thread spinning forever": ("import threading\nthreading.Thread(target=lambda: [0 for _ in iter(int, 1)], daemon=False)"
                                ".start()\n" + WRONG, ASSERTS),
    "infinite recursion": ("def f(x):\n    return f(x)\n", ASSERTS),
    "segfault": ("import ctypes\nctypes.string_at(0)\n", ASSERTS),
    "rewrites the harness": ("try:\n    open('/harness/harness.py', 'w').write('')\nexcept Exception:\n    pass\n" + WRONG,
                             ASSERTS),
    "syntax error": ("def f(x) return 2x", ASSERTS),
    "hunts the nonce in its frames and forges the line": (
        "import os, re, sys\nfound = set()\nf = sys._getframe()\nwhile f is not None:\n"
        "    for v in list(f.f_locals.values()) + list(f.f_globals.values()):\n"
        "        if isinstance(v, (str, bytes)):\n"
        "            found.update(re.findall(r'[0-9a-f]{32}', v if isinstance(v, str) else v.decode('latin1')))\n"
        "    f = f.f_back\nfor n in found:\n    os.write(1, (n + ' [4]\\n').encode())\nos._exit(0)\n", ASSERTS),
    "reads the harness's memory and descriptors": (
        "import os\nok = False\nfor path in (f'/proc/{os.getppid()}/mem', f'/proc/{os.getppid()}/fd/0',\n"
        "             f'/proc/{os.getppid()}/environ'):\n    try:\n        open(path, 'rb').read(1)\n"
        "        ok = True\n    except Exception:\n        pass\ndef f(x):\n    return 2 * x if ok else -1\n", ASSERTS),
    "fills every writable folder with many files": (
        "import os\ndef fill(d):\n    i = 0\n    while True:\n        try:\n"
        "            open(f'{d}/f{i}', 'wb').write(b'x' * (1 << 20))\n        except OSError:\n            return i\n"
        "        i += 1\nn = sum(fill(d) for d in ('/tmp', '/work', '/dev/shm', '/', '/dev'))\n"
        "def f(x):\n    return 2 * x if n > 64 else -1\n", ASSERTS),
    "writes a guessed answer onto every descriptor": (
        "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'\\n[7]\\n')\n    except OSError:\n"
        "        pass\nos._exit(0)\n", ASSERTS),
}


@pytest.fixture(scope="module")
def grader():
    need_bwrap()
    g = CodeGrader(test_timeout=2.0, program_timeout=10.0, slots=SLOTS)
    g.check()
    return g


def _sandbox_processes(*, zombies: bool) -> list[int]:
    """Processes of the sandbox slots' uids; with zombies=False only those still alive."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            uid, state = int(fields["Uid"].split()[0]), fields["State"].strip()
        except (OSError, ValueError, KeyError):
            continue
        if UID_BASE <= uid < UID_BASE + UID_COUNT and (zombies or not state.startswith("Z")):
            pids.append(int(entry))
    return pids


def _no_sandbox_processes_left(*, zombies: bool = False) -> bool:
    """No process of a sandbox uid is alive. A sandbox's namespace init can end as a zombie for a moment
    until the host's init reaps it (dead, holding nothing but its pid); zombies=True waits for those too."""
    for _ in range(200):
        if not _sandbox_processes(zombies=zombies):
            return True
        time.sleep(0.1)
    return False


def _live_descendants() -> set[int]:
    """Live (non-zombie) processes below this one, by their parent links in /proc: visible to any
    user, so the check holds where the grader is not root and sandbox uids cannot be scanned for."""
    parent = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ...
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            parent[int(entry)] = int(fields[1])
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, pp in parent.items() if pp in frontier} - found
        found |= frontier
    return found


def _no_new_descendants(before: set[int]) -> bool:
    """Every process started below this one since ``before`` has ended (waits up to 20 s). Run under
    ``subreaper``, so a process whose parent died is reparented to this one, not lost from view."""
    for _ in range(200):
        _reap_orphans()
        if not _live_descendants() - before:
            return True
        time.sleep(0.1)
    return False


def _reap_orphans() -> None:
    """Collect the exit status of any child that has ended (orphans reparented here by ``subreaper``)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


@pytest.fixture
def subreaper():
    """This process as a child subreaper for the test: orphans of its descendants become its children
    (so a daemon a program double-forks stays visible to ``_live_descendants``)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_child_subreaper = 36
    assert libc.prctl(pr_set_child_subreaper, 1, 0, 0, 0) == 0
    yield
    libc.prctl(pr_set_child_subreaper, 0, 0, 0, 0)
    _reap_orphans()


def _digest(path: str) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


# Each calls a system call the sandbox's seccomp filter refuses, then would pass its tests: only the
# kill makes it score 0. (Without the filter, ptrace(PTRACE_TRACEME) and unshare in the sandbox's user
# namespace succeed, and a failing bpf or mount merely returns -1: each program then scores 1.0.)
_NR = "import ctypes, platform\nlibc = ctypes.CDLL(None)\nnr = {nrs}[platform.machine()]\n"
FORBIDDEN = {
    "ptrace": "import ctypes\nctypes.CDLL(None).ptrace(0, 0, 0, 0)\n",
    "bpf": _NR.format(nrs={"x86_64": 321, "aarch64": 280}) + "libc.syscall(nr, 0, 0, 0)\n",
    "perf_event_open": _NR.format(nrs={"x86_64": 298, "aarch64": 241}) + "libc.syscall(nr, 0, 0, -1, -1, 0)\n",
    "keyctl": _NR.format(nrs={"x86_64": 250, "aarch64": 219}) + "libc.syscall(nr, 0, 0, 0, 0, 0)\n",
    "unshare(CLONE_NEWUSER)": "import ctypes\nctypes.CDLL(None).unshare(0x10000000)\n",
    "mount": "import ctypes\nctypes.CDLL(None).mount(b'none', b'/tmp', b'tmpfs', 0, None)\n",
}


@pytest.mark.parametrize("call", list(FORBIDDEN))
def test_a_forbidden_system_call_kills_the_program_which_scores_zero_and_leaves_nothing(grader, call, subreaper,
                                                                                        monkeypatch):
    import tempfile

    good = "def f(x):\n    return 2 * x\n"
    runs = Path(tempfile.mkdtemp(prefix="grpo-test-runs-"))  # the runs' folders go here, to see them go
    os.chmod(runs, 0o755)  # a sandbox uid passes through it to its work folder
    monkeypatch.setattr(tempfile, "tempdir", str(runs))
    before = _live_descendants()
    assert grader.grade(FORBIDDEN[call] + "print('alive after the call')\n" + good, ASSERTS) == 0.0
    res = grader.sandbox.run({"solution.py": FORBIDDEN[call] + "print('alive after the call')\n"}, ["io"],
                             timeout=5.0)
    assert res.exit_code == -31 or res.exit_code == 128 + 31 or "alive" not in res.stdout, res  # SIGSYS
    assert "alive after the call" not in res.stdout
    assert grader.grade(good, ASSERTS) == 1.0  # the same program without the call passes
    left = list(runs.iterdir())
    monkeypatch.undo()
    shutil.rmtree(runs)
    assert _no_new_descendants(before) and not left
    if os.geteuid() == 0:
        assert _no_sandbox_processes_left()


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_program_scores_zero_and_the_host_is_unaffected(grader, name, subreaper):
    program, sample = HOSTILE[name]
    passwd = _digest("/etc/passwd")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    program = program.replace("('1.1.1.1', 53)", f"('127.0.0.1', {listener.getsockname()[1]})")
    before = _live_descendants()
    assert grader.grade(program, sample) == 0.0
    assert _no_new_descendants(before)  # as any user: nothing the program started is still running
    with pytest.raises(BlockingIOError):
        listener.accept()  # nobody reached the host's port
    listener.close()
    assert _digest("/etc/passwd") == passwd
    if os.geteuid() == 0:
        assert _no_sandbox_processes_left()
    # the next sample is graded as usual
    assert grader.grade(GOOD_ASSERT, ASSERTS) == 1.0


def test_writable_space_inside_the_sandbox_is_bounded(grader):
    """tmpfs pages are host memory outside RLIMIT_AS: the program's writable folders are bounded
    tmpfs (16 MiB for /work and /tmp, 1 MiB for /dev/shm) and the root is read-only, so at most
    about 33 MiB can be written in all; the program reports how much it managed."""
    program = ("import os\ndef fill(d):\n    i = 0\n    while True:\n        try:\n"
               "            open(f'{d}/f{i}', 'wb').write(b'x' * (1 << 20))\n        except OSError:\n"
               "            return i\n        i += 1\nprint(sum(fill(d) for d in ('/tmp', '/work', '/dev/shm', '/', '/dev')))\n")
    res = grader.sandbox.run({"solution.py": program}, ["io"], timeout=10.0)
    assert res.exit_code == 0 and not res.timed_out, res
    written_mib = int(res.stdout.split()[-1])
    assert 0 < written_mib <= 34, written_mib


@needs_bwrap
def test_hostile_programs_do_not_starve_correct_ones_in_the_same_step():
    """A step's hung programs hold the slots until their deadlines; each correct program's time budget
    starts when its own first test runs, so it is still graded 1 (reviewer's case: 3 of 32 hung)."""
    import concurrent.futures as cf

    g = CodeGrader(test_timeout=2.0, program_timeout=5.0, slots=2)  # a busy host may start a sandbox slowly
    hung = "def f(x):\n    while True:\n        pass\n"
    programs = [hung if i % 4 == 0 else GOOD_ASSERT for i in range(12)]
    with cf.ThreadPoolExecutor(12) as ex:
        scores = list(ex.map(lambda p: g.grade(p, ASSERTS), programs))
    assert scores == [0.0 if p is hung else 1.0 for p in programs]


@pytest.mark.parametrize("program,sample", [(GOOD_ASSERT, ASSERTS), (GOOD_IO, IO),
                                            ("def f(x):\n    return [x, x]\n", {"tests": ["assert f(1) == [1, 1]"]}),
                                            ("def f(x):\n    return x % 2 == 0\n",
                                             {"tests": ["assert f(4)", "assert not f(3)", "assert f(2) is True",
                                                        "assert 0 <= 1 < 2", "assert 3 in [f(1), 3]"]}),
                                            ("n = int(input())\nprint(n * 2)\nprint(n * 3)\n", IO_TWO_LINES)])
def test_correct_programs_score_one(grader, program, sample):
    assert grader.grade(program, sample) == 1.0


def test_share_of_tests_passed(grader):
    # f(2) == 4 passes, f(5) == 10 does not (9): one of two
    assert grader.grade("def f(x):\n    return 4 if x == 2 else 9\n", ASSERTS) == 0.5


def test_missing_or_empty_tests_give_zero_never_one(grader):
    assert grader.grade(GOOD_ASSERT, {}) == 0.0
    assert grader.grade(GOOD_ASSERT, {"tests": []}) == 0.0
    assert grader.grade(GOOD_ASSERT, {"io": []}) == 0.0


def test_malformed_tests_are_errors_naming_the_test(grader):
    with pytest.raises(ValueError, match="not one assert"):
        grader.grade(GOOD_ASSERT, {"tests": ["f(2) == 4"]})
    with pytest.raises(ValueError, match="io case 0"):
        grader.grade(GOOD_IO, {"io": [{"input": "1"}]})


def test_plan_assert_splits_comparisons_and_keeps_literals_outside():
    exprs, host, decide = plan_assert("assert f(2) == 4")
    assert exprs == ["f(2)"] and host == [None, (4,)] and decide([4, 4]) and not decide([4, 5])
    exprs, host, decide = plan_assert("assert g(1) < h(2) <= [3]")
    assert exprs == ["g(1)", "h(2)"] and host == [None, None, ([3],)]
    exprs, host, decide = plan_assert("assert not g(1)")
    assert exprs == ["g(1)"] and decide([0]) and not decide([1])


def test_extract_code_takes_the_last_block():
    assert extract_code("a\n```python\nx = 1\n```\nb\n```\ny = 2\n```") == "y = 2\n"
    assert extract_code("plain = 1") == "plain = 1"


def test_many_programs_in_parallel_stay_bounded(grader):
    """4 programs that never finish on 2 slots with 2 s per test: two rounds of about 2 s each. The bound
    is generous (twice the serial time): it fails only when hung programs are not killed at their deadline."""
    import concurrent.futures as cf

    hung = "def f(x):\n    while True:\n        pass\n"
    start = time.monotonic()
    with cf.ThreadPoolExecutor(4) as ex:
        scores = list(ex.map(lambda _: grader.grade(hung, {"tests": ["assert f(1) == 2"]}), range(4)))
    assert scores == [0.0] * 4
    assert time.monotonic() - start < 4 * grader.test_timeout * 2
    if os.geteuid() == 0:
        assert _no_sandbox_processes_left(zombies=True)


@needs_bwrap
def test_code_reward_is_a_registered_reward_checked_at_resolve():
    from grpo.rewards.code_rewards import code_batch_reward, code_strict_batch_reward

    fn = resolve_reward("code")
    assert fn.fn is code_batch_reward and fn.batch and is_batch_reward(fn.fn)
    assert fn.valid is program_parses and fn.startup_check is check_code_sandbox  # declared, not attributes
    assert code_reward(GOOD_IO, IO) == 1.0  # the per-sample protocol, as grpo.rewards.code_reward
    half = "def f(x):\n    return 4 if x == 2 else 9\n"
    out = fn([GOOD_IO, half, GOOD_ASSERT], [IO, ASSERTS, {"tests": ["f(2) == 4"]}])
    assert out[:2] == [1.0, 0.5] and isinstance(out[2], ValueError)  # a malformed test fails its sample only
    assert code_strict_batch_reward([GOOD_IO, half], [IO, ASSERTS]) == [1.0, 0.0]


@pytest.mark.parametrize("bwrap", ["missing", "cannot start", "cannot be executed"])
def test_no_sandbox_means_a_clear_error_never_an_unsandboxed_run(monkeypatch, tmp_path, bwrap):
    """faults.md row 44: without a working bubblewrap (none on the PATH, or one that fails as it does
    without user namespaces) grading raises SandboxError saying which, with the install instructions,
    and the program never runs: a program that would leave a file on the host leaves none."""
    from grpo.rewards.sandbox import INSTALL_HINT

    import tempfile

    false = shutil.which("false")  # a bwrap that exits 1 at once
    bin_dir = Path(tempfile.mkdtemp(prefix="grpo-fake-bwrap-"))  # as root, bwrap starts under a sandbox uid:
    bin_dir.chmod(0o755)                                          # the folder must be open to it
    monkeypatch.setenv("PATH", str(bin_dir))
    if bwrap == "cannot start":
        (bin_dir / "bwrap").symlink_to(false)
    elif bwrap == "cannot be executed":  # exec fails: its interpreter does not exist
        (bin_dir / "bwrap").write_text("#!/nonexistent/interpreter\n")
        (bin_dir / "bwrap").chmod(0o755)
    marker = tmp_path / "ran-unsandboxed"
    program = f"open({str(marker)!r}, 'w').write('ran')\n" + GOOD_ASSERT
    g = CodeGrader(slots=1)
    with pytest.raises(SandboxError) as err:
        g.check()
        g.grade(program, ASSERTS)
    want = {"missing": "code sandbox: bubblewrap (bwrap) is not installed; ",
            "cannot start": "code sandbox: bubblewrap could not start a sandbox (exit 1, stderr ''); ",
            "cannot be executed": f"code sandbox: {bin_dir / 'bwrap'} cannot be run (FileNotFoundError: No such "
                                  "file or directory); "}[bwrap]
    assert str(err.value) == want + INSTALL_HINT and "apt-get install -y bubblewrap" in INSTALL_HINT
    with pytest.raises(SandboxError):
        g.grade(program, ASSERTS)  # grading itself refuses too, not only the start-up check
    assert not marker.exists()
    shutil.rmtree(bin_dir)


@needs_bwrap
def test_the_unprivileged_flavour_of_the_sandbox_also_confines(tmp_path, subreaper):
    """Where the grader is not root, bwrap maps the program to uid 65534 in its own user namespace
    (no per-slot uid to kill by; the PID namespace and --die-with-parent clean up). Exercised here
    by forcing that flavour."""
    g = CodeGrader(test_timeout=2.0, slots=1)
    g.sandbox.as_root = False
    g.check()
    assert g.grade(GOOD_ASSERT, ASSERTS) == 1.0
    before = _live_descendants()
    for name in ("writes /etc/passwd", "reads the repository", "network connection", "os._exit(0) before the tests",
                 "object equal to anything", "reads the harness's memory and descriptors",
                 "daemon that outlives the run"):
        program, sample = HOSTILE[name]
        assert g.grade(program, sample) == 0.0, name
    assert _no_new_descendants(before)  # no sandbox uid to scan for here: the PID namespace cleaned up


# Reports who the program runs as, and (by the host's wall clock, which no namespace here changes)
# from when to when; the sleep makes runs started together overlap.
WHOAMI = ("import os, time\nstart = time.time()\ntime.sleep(1.0)\n"
          "print(os.getuid(), os.geteuid(), os.getgid(), os.getegid(), sorted(os.getgroups()), start, time.time())\n")


def _whoami(sandbox) -> dict:
    res = sandbox.run({"solution.py": WHOAMI}, ["io"], timeout=20.0)
    assert res.exit_code == 0 and not res.timed_out, res
    uid, euid, gid, egid, *rest = res.stdout.split(maxsplit=4)
    groups, times = rest[0].rsplit("]", 1)
    start, end = (float(t) for t in times.split())
    return dict(uid=int(uid), euid=int(euid), gid=int(gid), egid=int(egid), groups=groups + "]", start=start, end=end)


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="per-run sandbox uids are given only where the grader is root")
def test_concurrent_graders_never_share_a_sandbox_uid():
    """Two graders (as two reward worker processes would be) running at once: every run has its own
    unprivileged uid from the sandbox range (never root), so one run's clean-up cannot kill another's
    program (which would turn a pass into a fail). Each program reports the uid and gid it runs as."""
    import concurrent.futures as cf

    a, b = CodeGrader(test_timeout=5.0, slots=2), CodeGrader(test_timeout=5.0, slots=2)
    with cf.ThreadPoolExecutor(4) as ex:
        runs = list(ex.map(lambda g: _whoami(g.sandbox), (a, b, a, b)))
    for r in runs:
        assert UID_BASE <= r["uid"] < UID_BASE + UID_COUNT, r
        assert r["euid"] == r["uid"] and r["gid"] == r["egid"] == r["uid"], r
        assert r["groups"] in ("[]", f"[{r['uid']}]"), r  # no supplementary group of the host's root
    overlapping = [(r, q) for i, r in enumerate(runs) for q in runs[i + 1:]
                   if r["start"] < q["end"] and q["start"] < r["end"]]
    assert overlapping, runs  # four 1 s programs on four slots: some ran at the same time
    for r, q in overlapping:
        assert r["uid"] != q["uid"], (r, q)
    # the programs still pass their tests under those uids
    slow_good = "import time\ntime.sleep(0.5)\ndef f(x):\n    return 2 * x\n"
    with cf.ThreadPoolExecutor(4) as ex:
        futs = [ex.submit(g.grade, slow_good, ASSERTS) for g in (a, b, a, b)]
        assert [f.result() for f in futs] == [1.0] * 4


@needs_bwrap
def test_the_unprivileged_flavour_runs_the_program_as_nobody():
    """Where the grader is not root, bwrap maps the program to uid and gid 65534 (nobody) in its own user
    namespace: the program reports that, never the grader's own uid or root."""
    g = CodeGrader(test_timeout=2.0, slots=1)
    g.sandbox.as_root = False
    r = _whoami(g.sandbox)
    assert (r["uid"], r["euid"], r["gid"], r["egid"]) == (65534, 65534, 65534, 65534), r


def test_a_correct_program_that_prints_a_lot_still_passes_its_asserts(grader):
    chatty = "for i in range(20000):\n    print('debug line', i)\ndef f(x):\n    return 2 * x\n"  # ~300 KB
    assert grader.grade(chatty, ASSERTS) == 1.0


def test_without_libseccomp_bindings_the_sandbox_refuses_to_run(monkeypatch):
    import sys

    from grpo.rewards import seccomp_filter
    from grpo.rewards.sandbox import Sandbox

    seccomp_filter.filter_bpf.cache_clear()
    monkeypatch.setitem(sys.modules, "pyseccomp", None)  # as if not installed
    with pytest.raises(SandboxError, match=r"seccomp filter needs libseccomp.*pip install 'pyseccomp"):
        Sandbox(slots=1).check()
