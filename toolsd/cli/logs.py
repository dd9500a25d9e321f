"""`toolsd logs ID`: print a background process's output, and follow it with -f.

`logs` reads with explicit `since` offsets only, so it never moves the read mark an agent's
`process.output` calls share: tailing a log never steals output from the agent.
"""

from __future__ import annotations

import os
import sys

from toolsd.cli.common import connect
from toolsd.wire.protocol import MARKER_SINCE

# Each read asks for at most this many characters; a longer stretch comes back as head, marker
# and tail, and the marker says where to carry on right after the head. Small enough that one
# read is a short job for the daemon, large enough that a long log takes few round trips.
CHUNK_CHARS = 256 << 10
# How long one read of `logs -f` waits on the daemon for new output before asking again.
FOLLOW_WAIT_S = 10.0
# `--tail`: how far back from the end the first look for the last lines reaches.
TAIL_WINDOW_BYTES = 64 << 10


def add_parser(sub, common) -> None:
    p = sub.add_parser("logs", parents=[common],
                       help="print a background process's output (never moves the agent's "
                            "read mark)")
    p.add_argument("id", help="process id or name, e.g. bg3 or web")
    p.add_argument("-f", "--follow", action="store_true",
                   help="keep printing new output until the process ends (Ctrl-C stops)")
    p.add_argument("--since", type=int, default=0, metavar="N",
                   help="start at byte offset N of its output (default 0)")
    p.add_argument("-n", "--tail", type=int, metavar="N",
                   help="start with its last N lines (default: all of its output)")
    p.set_defaults(func=cmd_logs)


def cmd_logs(args) -> int:
    if args.since < 0:
        print("toolsd logs: --since is a byte offset, 0 or more", file=sys.stderr)
        return 2
    if args.tail is not None and args.tail < 0:
        print("toolsd logs: --tail is a number of lines, 0 or more", file=sys.stderr)
        return 2
    pos = args.since
    try:
        with connect(args) as c:
            if args.tail is not None:
                text, pos = last_lines(c, args.id, args.tail)
                sys.stdout.write(text)
                sys.stdout.flush()
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
                if not args.follow:
                    return 0
                if r["status"] != "running" and not text:
                    print(f"[toolsd logs: {args.id} {how_it_ended(r)}]", file=sys.stderr)
                    return 0
    except BrokenPipeError:
        # `toolsd logs bg1 | head`: the reader has all it wants. Point stdout at /dev/null so
        # that the interpreter's final flush does not complain.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def how_it_ended(reply: dict) -> str:
    """`exited (exit code 3)`, `stopped (SIGTERM)`, from a process.output reply."""
    if reply.get("signal"):
        return f"{reply['status']} (killed by {reply['signal']})"
    return f"{reply['status']} (exit code {reply.get('exit_code')})"


def last_lines(client, process_id: str, n: int) -> tuple[str, int]:
    """(the last `n` lines of the process's output, the offset after them). Reads back from
    the end, a window twice as long each time, until it holds n lines or all that is kept."""
    end = client.process_output(process_id, since=0, max_output_chars=0)["next"]
    window = TAIL_WINDOW_BYTES
    while True:
        start = max(0, end - window)
        text, after = read_from(client, process_id, start)
        if start > 0:
            # The window began inside a line: that part is not a whole line.
            text = text[text.find("\n") + 1:] if "\n" in text else ""
        lines = text.splitlines(keepends=True)
        if len(lines) >= n or start == 0:
            return "".join(lines[-n:] if n else []), after
        window *= 2


def read_from(client, process_id: str, pos: int) -> tuple[str, int]:
    """All the output there is from `pos` on, and the offset after it."""
    pieces = []
    while True:
        r = client.process_output(process_id, since=pos, max_output_chars=CHUNK_CHARS)
        text, pos, whole = next_piece(r)
        pieces.append(text)
        if whole:
            return "".join(pieces), pos


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
