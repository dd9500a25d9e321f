"""`toolsd close ID`: end a session and everything it runs (its processes, REPLs, sandbox)."""

from __future__ import annotations

from toolsd.cli.common import connect


def add_parser(sub, common) -> None:
    p = sub.add_parser("close", parents=[common],
                       help="close a session: its processes, REPLs and sandbox end")
    p.add_argument("session", metavar="ID", help="the session's id, as `toolsd open` printed "
                                                 "it (`toolsd status` lists them)")
    p.set_defaults(func=cmd_close)


def cmd_close(args) -> int:
    with connect(args) as c:
        r = c.session_close(args.session)
    processes, repls = r["processes_stopped"], r["repls_stopped"]
    print(f"{args.session} closed: stopped {processes} process{'es' if processes != 1 else ''} "
          f"and {repls} REPL{'s' if repls != 1 else ''}")
    return 0
