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


def add_parser(sub, common) -> None:
    p = sub.add_parser("logs", parents=[common],
                       help="print a background process's output (never moves the agent's "
                            "read mark)")
    p.add_argument("id", help="process id or name, e.g. bg3 or web")
    p.add_argument("-f", "--follow", action="store_true",
                   help="keep printing new output until the process ends (Ctrl-C stops)")
    p.add_argument("--since", type=int, default=0, metavar="N",
                   help="start at byte offset N of its output (default 0)")
    p.set_defaults(func=cmd_logs)


def cmd_logs(args) -> int:
    if args.since < 0:
        print("toolsd logs: --since is a byte offset, 0 or more", file=sys.stderr)
        return 2
    pos = args.since
    try:
        with connect(args) as c:
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
