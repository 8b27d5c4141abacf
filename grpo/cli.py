"""The `grpo` command: train, eval, toy."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"toy": _toy}
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        print("usage: grpo {" + ",".join(commands) + "} [options]")
        return 0 if (not argv or argv[0] in ("-h", "--help")) else 2
    return commands[argv[0]](argv[1:]) or 0


def _toy(argv: list[str]) -> int:
    from grpo.toy import main as toy_main

    toy_main(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
