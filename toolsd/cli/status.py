"""`toolsd status`: is the daemon up, and what it has open."""

from __future__ import annotations

import json

from toolsd.cli.common import connect, where
from toolsd.client import ToolsdError


def add_parser(sub, common) -> None:
    p = sub.add_parser("status", parents=[common], help="is the daemon up; what it has open")
    p.add_argument("--json", action="store_true",
                   help="print hello's and session.list's answers as JSON")
    p.set_defaults(func=cmd_status)


def refusals(c, sessions) -> dict[str, int]:
    """Session id -> refusals in its connection log (protocol 1.2 "egress"), where it has
    a filtered network."""
    counts = {}
    for s in sessions:
        if s["network"] == "filtered":
            try:
                entries = c.session_network(s["session"])["entries"]
            except ToolsdError:
                continue  # closed meanwhile
            counts[s["session"]] = sum(e["verdict"] == "denied" for e in entries)
    return counts


def cmd_status(args) -> int:
    # A person asking "is it up?" gets an answer even from a daemon that hangs.
    with connect(args, timeout=30) as c:
        hello = c.hello("toolsd-cli")
        sessions = c.session_list()["sessions"]
        refused = refusals(c, sessions)
    if args.json:
        print(json.dumps({"hello": hello, "sessions": sessions}, indent=2))
        return 0
    print(f"{hello['server']} on {where(args)} (as tenant {hello.get('tenant', 'local')})")
    print(f"sandbox: {hello['sandbox']}; shells: {', '.join(hello['shells'])}; "
          f"languages: {', '.join(hello['languages'])}")
    print(f"sessions: {len(sessions)}")
    for s in sessions:
        mode = "rw" if s["writable"] else "ro"
        dead = "" if s.get("alive", True) else "  DEAD (its sandbox died)"
        print(f"  {s['session']}  {s['workspace']}  {s['sandbox']}  net={s['network']}  {mode}  "
              f"processes={s['processes']}  repls={s['repls']}  "
              f"tenant={s.get('tenant', 'local')}{dead}")
        if refused.get(s["session"]):
            print(f"    its network refused {refused[s['session']]} connection(s) lately "
                  f"(toolsd net {s['session']} lists them)")
        host_exec = s.get("host_exec") or []
        if host_exec:
            print(f"    the host's git would run what this session added "
                  f"({len(host_exec)}; check before running git there):")
            for line in host_exec:
                print(f"      {line}")
    return 0
