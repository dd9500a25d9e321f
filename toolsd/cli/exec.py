"""`toolsd exec -- COMMAND`: run one command in a fresh session and print its output."""

from __future__ import annotations

import argparse
import os
import sys

from toolsd.cli.common import connect


def add_parser(sub, common) -> None:
    p = sub.add_parser("exec", parents=[common],
                       help="run one command in a fresh session and print its output")
    p.add_argument("--workspace", default=os.getcwd())
    p.add_argument("--network", choices=["none", "host"], default="none")
    p.add_argument("--read-only", action="store_true")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("command", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_exec)


def cmd_exec(args) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("toolsd exec: give a command after --, e.g. toolsd exec -- ls -la", file=sys.stderr)
        return 2
    import shlex

    text = command[0] if len(command) == 1 else shlex.join(command)
    with connect(args) as c:
        session = c.session_open(os.path.abspath(args.workspace), network=args.network,
                                 writable=not args.read_only)["session"]
        try:
            result = c.shell_run(session, text, timeout_s=args.timeout)
        finally:
            c.session_close(session)
    sys.stdout.write(result["output"])
    if result["output"] and not result["output"].endswith("\n"):
        sys.stdout.write("\n")
    if result["timed_out"]:
        print(f"toolsd exec: timed out after {args.timeout} s", file=sys.stderr)
        return 124
    if result["exit_code"] is None:
        print(f"toolsd exec: killed by {result['signal']}", file=sys.stderr)
        import signal

        return 128 + int(getattr(signal, result["signal"] or "SIGKILL", signal.SIGKILL))
    return result["exit_code"]
