"""`toolsd start --session ID -- COMMAND`: a background process in a kept session.

It prints the process's id alone on stdout (`P=$(toolsd start ...)`); `toolsd logs`, `toolsd
attach` (with --tty) and `toolsd kill` take it. It runs until it ends, is killed, or its
session is closed."""

from __future__ import annotations

import argparse
import shlex
import sys

from toolsd.cli.common import CommandFailed, connect


def add_parser(sub, common) -> None:
    p = sub.add_parser("start", parents=[common],
                       help="start a background process in a session kept with `toolsd open`")
    p.add_argument("--session", required=True, metavar="ID",
                   help="the session to run it in (from `toolsd open`)")
    p.add_argument("--name", default="", metavar="NAME",
                   help="a name shown by `toolsd ps` beside its command (default: none)")
    p.add_argument("--tty", action="store_true",
                   help="give it a terminal, so that `toolsd attach` can type into it")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="after --: the command, run by bash in the workspace")
    p.set_defaults(func=cmd_start)


def command_text(words: list[str], command: str) -> str:
    """One shell command from what followed `--` (one word is taken as shell text)."""
    words = words[1:] if words[:1] == ["--"] else words
    if not words:
        raise CommandFailed(command, f"give a command after --, e.g. toolsd {command} "
                                     f"--session ID -- python3 -m http.server", 2)
    return words[0] if len(words) == 1 else shlex.join(words)


def cmd_start(args) -> int:
    text = command_text(args.command, "start")
    with connect(args) as c:
        started = c.process_start(args.session, text, name=args.name,
                                  **({"tty": True} if args.tty else {}))
    pid = started["id"]
    print(pid)
    print(f"toolsd start: {pid} (pid {started['pid']}) runs in {args.session}; `toolsd logs -f "
          f"{pid}` follows it, `toolsd kill {pid}` stops it", file=sys.stderr)
    return 0
