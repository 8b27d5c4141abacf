"""The trusted start of every sandboxed run (grpo.rewards.sandbox); standard library only.

argv: cpu_seconds address_space_bytes file_size_bytes open_files processes mode
mode "selftest": print "sandbox ok".
mode "io":       exec the program /work/solution.py as __main__ with the test input on stdin.
mode "assert":   a forked child runs /work/solution.py as a module and evaluates the expressions of
                 /work/test.json (the non-literal operands of one assert); this process then writes ONE
                 line "<nonce> <repr of the values>" (or "<nonce> !<why>") to stdout, the nonce read from
                 stdin after the fork (see _assert_mode). The grader (outside the sandbox) parses the
                 values with ast.literal_eval and decides the test; only exact built-in types (int,
                 float, str, bytes, bool, None, list, tuple, dict, set) are ever written, so no object of
                 the program reaches it.

In the child, everything needed after the program ran is bound to locals before it runs, and test
expressions are evaluated with a snapshot of the builtins, so monkeypatching builtins, print,
AssertionError or sys.exit changes nothing.
"""

import os
import resource
import sys


def _limits(argv):
    cpu, mem, fsize, nofile, nproc = (int(a) for a in argv[:5])
    for res, val in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, mem), (resource.RLIMIT_FSIZE, fsize),
                     (resource.RLIMIT_NOFILE, nofile), (resource.RLIMIT_NPROC, nproc), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(res, (val, val))


def _child(w, exprs):
    """Runs in the forked child: the program, then the test expressions; writes the values' repr to w."""
    import builtins

    safe = dict(builtins.__dict__)  # a snapshot: later patches of the builtins module do not reach it
    write, encode, exit_now, rep, typ, comp, ev = os.write, str.encode, os._exit, repr, type, compile, eval
    scalars = (int, float, bool, str, bytes, type(None))
    containers = (list, tuple, set)

    def plain(v, depth):
        t = typ(v)
        for s in scalars:
            if t is s:
                return True
        if depth > 30:
            return False
        for c in containers:
            if t is c:
                for x in v:
                    if not plain(x, depth + 1):
                        return False
                return True
        if t is dict:
            for k in v:
                if not plain(k, depth + 1) or not plain(v[k], depth + 1):
                    return False
            return True
        return False

    def report(text):
        try:
            write(w, encode("\n" + text + "\n"))
        finally:
            exit_now(0)

    try:
        with open("/work/solution.py") as f:
            code = comp(f.read(), "solution.py", "exec")
        ns = {"__name__": "solution", "__builtins__": dict(safe)}
        ev(code, ns)
    except BaseException:
        report("!the program raised or exited before the test ran")
    values = []
    try:
        for src in exprs:
            g = dict(ns)
            g["__builtins__"] = safe
            v = ev(comp(src, "<test>", "eval"), g)
            if not plain(v, 0):
                report("!a value of a type the grader does not accept")
            values.append(v)
        text = rep(values)
    except BaseException:
        report("!the test expression raised")
    report(text)


def _assert_mode():
    """The nonce never enters the program's memory: this process forks the child that runs the program
    BEFORE reading the nonce from stdin, the child closes its copy of stdin first thing, and this
    process is made non-dumpable, so the child (same uid) can neither ptrace it nor read its memory or
    file descriptors through /proc. The child's last line on a private pipe carries the values; this
    process, once the child has exited, writes "<nonce> <that line>" to stdout."""
    import ctypes
    import json
    import select

    with open("/work/test.json") as f:
        exprs = json.load(f)
    if ctypes.CDLL(None).prctl(4, 0) != 0:  # PR_SET_DUMPABLE = 0, inherited by the fork
        sys.exit("harness: cannot make the harness non-dumpable")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(0)
        os.open(os.devnull, os.O_RDONLY)
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 1)  # the program's prints do not matter to an assert test (and cannot crowd out the
        os.close(quiet)  # result line); stdout belongs to this process alone
        os.close(r)
        _child(w, exprs)
        os._exit(0)
    os.close(w)
    nonce = b""
    while chunk := os.read(0, 4096):
        nonce += chunk
    nonce = nonce.decode().strip()
    data, exited = b"", False
    while not exited and len(data) < (1 << 20):
        exited = os.waitpid(pid, os.WNOHANG)[0] == pid
        ready, _, _ = select.select([r], [], [], 0 if exited else 0.05)
        while ready:  # drain what is there; the program's descendants may hold the pipe open
            chunk = os.read(r, 65536)
            if not chunk:
                break
            data += chunk
            ready, _, _ = select.select([r], [], [], 0)
    lines = [ln for ln in data.decode("utf-8", "replace").split("\n") if ln]
    os.write(1, (nonce + " " + (lines[-1] if lines else "!no result") + "\n").encode())
    os._exit(0)


def main():
    argv = sys.argv[1:]
    mode = argv[5]
    if mode == "selftest":
        print("sandbox ok")
        return
    if mode == "assert":
        _limits(argv)  # the spec is read after the limits: they hold for everything below
        _assert_mode()
    if mode == "io":
        _limits(argv)
        os.execv(sys.executable, [sys.executable, "-I", "-S", "-B", "/work/solution.py"])
    sys.exit(f"harness: unknown mode {mode!r}")


if __name__ == "__main__":
    main()
