"""`toolsd kill ID`: stop a background process and everything it started."""

from __future__ import annotations

import sys

from toolsd.cli.common import connect


def add_parser(sub, common) -> None:
    p = sub.add_parser("kill", parents=[common],
                       help="stop a background process and everything it started")
    p.add_argument("id", help="process id or name, e.g. bg3 or web")
    p.add_argument("--grace", type=float, default=2.0, metavar="S",
                   help="seconds between SIGTERM and SIGKILL (default 2)")
    p.set_defaults(func=cmd_kill)


def cmd_kill(args) -> int:
    if args.grace < 0:
        print("toolsd kill: --grace is seconds, 0 or more", file=sys.stderr)
        return 2
    with connect(args) as c:
        r = c.process_stop(args.id, grace_s=args.grace)
    how = f" ({r['signal']})" if r["signal"] else (
        f" (exit code {r['exit_code']})" if r["exit_code"] is not None else "")
    print(f"{r['id']}: {r['status']}{how}; ended {r['ended']} "
          f"process{'es' if r['ended'] != 1 else ''}, {r['survivors']} "
          f"survivor{'s' if r['survivors'] != 1 else ''}")
    if r["survivors"]:
        print(f"toolsd kill: {r['survivors']} process(es) of {r['id']} would not die (stuck in "
              f"the kernel?); `toolsd ps` shows them", file=sys.stderr)
        return 1
    return 0
