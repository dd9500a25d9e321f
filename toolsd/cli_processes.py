"""`toolsd ps`, `toolsd logs`, `toolsd kill`: a person looking at the background processes
agents started, reading their output and stopping them.

`logs` reads with explicit `since` offsets only, so it never moves the read mark an agent's
`process.output` calls share: tailing a log never steals output from the agent.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

from toolsd.wire.protocol import MARKER_SINCE

# Each read asks for at most this many characters; a longer stretch comes back as head, marker
# and tail, and the marker says where to carry on right after the head. Small enough that one
# read is a short job for the daemon, large enough that a long log takes few round trips.
CHUNK_CHARS = 256 << 10
# How long one read of `logs -f` waits on the daemon for new output before asking again.
FOLLOW_WAIT_S = 10.0
COLUMNS = ("ID", "SESSION", "PID", "STATUS", "UPTIME", "CPU", "RSS", "DESC", "COMMAND")


def add_parser(sub, common) -> None:
    p = sub.add_parser("ps", parents=[common], help="list background processes")
    p.add_argument("--session", help="only the processes of this session")
    p.add_argument("-r", "--running", action="store_true", help="only those still running")
    p.add_argument("--json", action="store_true", help="print process.list's answer as JSON")
    p.set_defaults(func=cmd_ps)

    p = sub.add_parser("logs", parents=[common],
                       help="print a background process's output (never moves the agent's "
                            "read mark)")
    p.add_argument("id", help="process id, e.g. bg3")
    p.add_argument("-f", "--follow", action="store_true",
                   help="keep printing new output until the process ends (Ctrl-C stops)")
    p.add_argument("--since", type=int, default=0, metavar="N",
                   help="start at byte offset N of its output (default 0)")
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("kill", parents=[common],
                       help="stop a background process and everything it started")
    p.add_argument("id", help="process id, e.g. bg3")
    p.add_argument("--grace", type=float, default=2.0, metavar="S",
                   help="seconds between SIGTERM and SIGKILL (default 2)")
    p.set_defaults(func=cmd_kill)


def _connect(args):
    from toolsd.cli import connect  # cli imports this module at its end: import here, not at top

    return connect(args)


# ---------------------------------------------------------------- ps


def cmd_ps(args) -> int:
    with _connect(args) as c:
        procs = c.process_list(args.session)["processes"]
        # A closed session's processes are still listed; an id nobody knows is a typo.
        if args.session is not None and not procs and args.session not in {
                s["session"] for s in c.session_list()["sessions"]}:
            print(f"toolsd ps: no session {_printable(args.session)}; `toolsd ps` lists the "
                  f"processes of every session", file=sys.stderr)
            return 1
    if args.running:
        procs = [p for p in procs if p["status"] == "running"]
    if args.json:
        print(json.dumps(procs, indent=2))
        return 0
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    print(format_table(procs, now=time.time(), width=width))
    return 0


def format_table(procs: list[dict], *, now: float, width: int | None = None) -> str:
    """The `toolsd ps` table; the command column is cut to `width` when one is given."""
    rows = [COLUMNS]
    for p in sorted(procs, key=lambda p: _id_number(p["id"])):
        rows.append((
            p["id"], p["session"], str(p["pid"]), _status(p),
            format_duration((p["ended_at"] or now) - p["started_at"]),
            f"{p['cpu_percent']:.1f}%", format_bytes(p["rss_bytes"]), str(p["descendants"]),
            _printable(_one_line(
                f"{p['name']}: {p['command']}" if p["name"] else p["command"])),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]
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


# ---------------------------------------------------------------- logs


def cmd_logs(args) -> int:
    if args.since < 0:
        print("toolsd logs: --since is a byte offset, 0 or more", file=sys.stderr)
        return 2
    pos = args.since
    try:
        with _connect(args) as c:
            while True:
                wait_s = FOLLOW_WAIT_S if args.follow else 0.0
                r = c.process_output(args.id, since=pos, wait_s=wait_s,
                                     max_output_chars=CHUNK_CHARS)
                if r["dropped_bytes"]:
                    print(f"[toolsd logs: {r['dropped_bytes']} bytes from offset {pos} are no "
                          f"longer kept; output resumes at {pos + r['dropped_bytes']}]",
                          file=sys.stderr, flush=True)
                text, pos, whole = next_piece(r)
                sys.stdout.write(text)
                sys.stdout.flush()
                if not whole:
                    continue  # more is there already: read on at once
                if not args.follow or (r["status"] != "running" and not text):
                    return 0
    except BrokenPipeError:
        # `toolsd logs bg1 | head`: the reader has all it wants. Point stdout at /dev/null so
        # that the interpreter's final flush does not complain.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def next_piece(reply: dict) -> tuple[str, int, bool]:
    """(text to print, offset to read from next, whether this read reached the end of what
    was there). A truncated read is printed up to its marker only: the rest is read next, in
    order, so nothing is printed twice or out of place."""
    text = reply["output"]
    if reply["truncated"]:
        m = MARKER_SINCE.search(text)
        if m is not None:
            return text[: m.start()], int(m.group(1)), False
    return text, reply["next"], True


# ---------------------------------------------------------------- kill


def cmd_kill(args) -> int:
    if args.grace < 0:
        print("toolsd kill: --grace is seconds, 0 or more", file=sys.stderr)
        return 2
    with _connect(args) as c:
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
