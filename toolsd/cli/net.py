"""`toolsd net SESSION`: what a session's network let through and refused (session.network)."""

from __future__ import annotations

import json
import time

from toolsd.cli.common import connect


def add_parser(sub, common) -> None:
    p = sub.add_parser("net", parents=[common],
                       help="a session's connections: allowed and refused, and why")
    p.add_argument("session", help="the session's id (toolsd status lists them)")
    p.add_argument("--since", type=int, default=0, metavar="N",
                   help="from entry N on (a previous call's `next`)")
    p.add_argument("--denied", action="store_true", help="only the refused connections")
    p.add_argument("--json", action="store_true", help="print the log as JSON (default: a table)")
    p.set_defaults(func=cmd_net)


def cmd_net(args) -> int:
    with connect(args) as c:
        log = c.session_network(args.session, since=args.since)
    entries = [e for e in log["entries"] if not args.denied or e["verdict"] == "denied"]
    if args.json:
        print(json.dumps({**log, "entries": entries}, indent=2))
        return 0
    print(f"session {args.session}: network {log.get('network', '?')}, "
          f"{len(log['entries'])} entries (next: {log['next']})")
    if log["dropped"]:
        print(f"  ({log['dropped']} older entries were dropped: the log keeps the latest)")
    for e in entries:
        when = time.strftime("%H:%M:%S", time.localtime(e["at"]))
        host = f"[{e['host']}]" if ":" in e["host"] else e["host"]
        traffic = f"  {e['sent']}B out, {e['received']}B in" if e["verdict"] == "allowed" else ""
        print(f"  {when}  {e['verdict']:<7}  {host}:{e['port']}  {e['why']}{traffic}")
    return 0
