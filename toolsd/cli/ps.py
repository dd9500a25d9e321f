"""`toolsd ps`: a person looking at the background processes agents started (`toolsd logs`
reads their output, `toolsd kill` stops them)."""

from __future__ import annotations

import json
import shutil
import sys
import time

from toolsd.cli.common import connect

COLUMNS = ("ID", "SESSION", "PID", "STATUS", "UPTIME", "CPU", "RSS", "DESC", "COMMAND")


def add_parser(sub, common) -> None:
    p = sub.add_parser("ps", parents=[common], help="list background processes")
    p.add_argument("--session", metavar="ID",
                   help="only the processes of this session (default: every session's)")
    p.add_argument("-r", "--running", action="store_true", help="only those still running")
    p.add_argument("-a", "--all", action="store_true",
                   help="also the ended processes of closed sessions (hidden by default)")
    p.add_argument("--json", action="store_true", help="print process.list's answer as JSON")
    p.set_defaults(func=cmd_ps)


def cmd_ps(args) -> int:
    with connect(args) as c:
        procs = c.process_list(args.session)["processes"]
        sessions = c.session_list()["sessions"]
        open_sessions = {s["session"] for s in sessions}
        # A closed session's processes are still listed; an id nobody knows is a typo.
        if args.session is not None and not procs and args.session not in open_sessions:
            print(f"toolsd ps: no session {_printable(args.session)}; `toolsd ps` lists the "
                  f"processes of every session", file=sys.stderr)
            return 1
    if args.running:
        procs = [p for p in procs if p["status"] == "running"]
    elif not args.all:
        # What a person looks for is what is still there: a closed session's ended
        # processes are history, asked for with --all.
        shown = [p for p in procs if p["status"] == "running" or p["session"] in open_sessions]
        if len(shown) < len(procs) and not args.json:
            hidden = len(procs) - len(shown)
            print(f"toolsd ps: {hidden} ended process{'es' if hidden != 1 else ''} of closed "
                  f"sessions not shown; --all shows them", file=sys.stderr)
        procs = shown
    if args.json:
        print(json.dumps(procs, indent=2))
        return 0
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    tenants = {s["session"]: s.get("tenant", "local") for s in sessions}
    print(format_table(procs, now=time.time(), width=width, tenants=tenants))
    return 0


def format_table(procs: list[dict], *, now: float, width: int | None = None,
                 tenants: dict[str, str] | None = None) -> str:
    """The `toolsd ps` table; the command column is cut to `width` when one is given. With
    `tenants` (session -> tenant) naming any but the local one, a TENANT column says whose
    each process is ("?" for a session closed since)."""
    by_tenant = tenants is not None and any(t != "local" for t in tenants.values())
    columns = COLUMNS[:2] + ("TENANT",) + COLUMNS[2:] if by_tenant else COLUMNS
    rows = [columns]
    for p in sorted(procs, key=lambda p: _id_number(p["id"])):
        tenant = (_printable(tenants.get(p["session"], "?")),) if by_tenant else ()
        rows.append((
            p["id"], p["session"], *tenant, str(p["pid"]), _status(p),
            format_duration((p["ended_at"] or now) - p["started_at"]),
            f"{p['cpu_percent']:.1f}%", format_bytes(p["rss_bytes"]), str(p["descendants"]),
            _printable(_one_line(
                f"{p['name']}: {p['command']}" if p["name"] else p["command"])),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns) - 1)]
    lines = []
    for row in rows:
        line = "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1]
        if width is not None and len(line) > width:
            line = line[: max(width - 1, 0)] + "…"
        lines.append(line.rstrip())
    return "\n".join(lines)


def _id_number(process_id: str) -> int:
    digits = process_id.removeprefix("bg")
    return int(digits) if digits.isdigit() else 0


def _status(p: dict) -> str:
    if p["status"] == "exited" and p["exit_code"] is not None:
        return f"exited {p['exit_code']}"
    return p["status"]


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _printable(text: str) -> str:
    """`text` with every character a terminal would act on instead of showing (ESC, so
    colour, cursor and OSC 52 clipboard sequences; other control and format characters)
    written as a Python escape: a process cannot hide its row or reach the terminal."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def format_duration(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def format_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "K", "M", "G"):
        if size < 1024 or unit == "G":
            return f"{size:.0f}{unit}" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024
    return f"{size:.1f}G"  # not reached
