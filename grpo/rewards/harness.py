"""The trusted start of every sandboxed run (grpo.rewards.sandbox); standard library only.

argv: cpu_seconds address_space_bytes file_size_bytes open_files processes mode
mode "selftest": print "sandbox ok".
mode "io":       exec the program /work/solution.py as __main__ with the test input on stdin.
mode "assert":   read {"nonce", "exprs"} from the stdin pipe and close it; run /work/solution.py as a
                 module; evaluate each expression of one assert; write ONE line
                 "<nonce> <repr of the values>" (or "<nonce> !<why>") to a copy of stdout taken before the
                 program ran. The grader (outside the sandbox) parses the values with ast.literal_eval
                 and decides the test; only exact built-in types (int, float, str, bytes, bool, None,
                 list, tuple, dict, set) are ever written, so no object of the program reaches it.

Everything the harness needs after the program ran is bound to locals before it runs, and test
expressions are evaluated with a snapshot of the builtins, so monkeypatching builtins, print,
AssertionError or sys.exit changes nothing here.
"""

import os
import resource
import sys


def _limits(argv):
    cpu, mem, fsize, nofile, nproc = (int(a) for a in argv[:5])
    for res, val in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, mem), (resource.RLIMIT_FSIZE, fsize),
                     (resource.RLIMIT_NOFILE, nofile), (resource.RLIMIT_NPROC, nproc), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(res, (val, val))


def _assert_mode():
    import builtins
    import json

    spec = json.loads(sys.stdin.read())
    os.close(0)
    os.open(os.devnull, os.O_RDONLY)  # fd 0 again, now empty: the spec pipe is gone
    nonce, exprs = spec.pop("nonce"), spec["exprs"]
    del spec
    safe = dict(builtins.__dict__)  # a snapshot: later patches of the builtins module do not reach it
    out_fd = os.dup(1)
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
            write(out_fd, encode(nonce + " " + text + "\n"))
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
