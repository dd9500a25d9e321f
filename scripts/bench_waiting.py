#!/usr/bin/env python3
"""What `waiting_for_input` costs a read: process.output of an idle process on a terminal and
of one on a stdin pipe (both asleep reading their input), and of one on a pipe that does not
read it (so every process of its tree is looked at), each next to
process.output of a process without input (no look at all), measured in the same daemon.

Run: .venv/bin/python scripts/bench_waiting.py   (scripts/bench.py runs it as a section)
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench import ms, report, running_daemon, stats, timed  # noqa: E402

from toolsd.client import Client  # noqa: E402

SAMPLES = 300
# Asleep in a read of its input, printing nothing: a prompt as the agent meets it.
READER = "read line; echo got $line"


def bench_waiting() -> None:
    with running_daemon() as (sock, root, _proc):
        workspace = os.path.join(root, "ws")
        os.makedirs(workspace)
        with Client(sock) as c:
            session = c.session_open(workspace)["session"]
            plain = c.process_start(session, "sleep 10000")["id"]
            tty = c.process_start(session, READER, tty=True)["id"]
            pipe = c.process_start(session, READER, stdin="pipe")["id"]
            # Not reading: no process shows the wait, so every process of its tree is read.
            busy = c.process_start(session, "sleep 10000", stdin="pipe")["id"]
            for bg in (tty, pipe):
                if not _waits(c, bg):
                    raise SystemExit(f"{bg} never showed waiting_for_input: nothing to measure")
            figures = {}
            # Interleaved rounds, so that the machine's load falls alike on each figure.
            for _ in range(3):
                for bg in (plain, tty, pipe, busy):
                    figures.setdefault(bg, []).extend(
                        timed(lambda bg=bg: c.process_output(bg), SAMPLES // 3))
            for bg in (plain, tty, pipe, busy):
                c.process_stop(bg)
            c.session_close(session)
    anchor = stats(figures[plain])[0]
    for bg, what in ((tty, "an idle tty: true process"), (pipe, "an idle stdin: pipe process"),
                     (busy, "a stdin: pipe process not reading")):
        median = stats(figures[bg])[0]
        report(f"process.output of {what}, median", ms(median),
               anchor=f"no input {ms(anchor)}", ratio=median / anchor)


def _waits(c: Client, bg: str) -> bool:
    """Whether `bg` shows waiting_for_input within a while (it starts asleep in its read)."""
    for _ in range(200):
        if c.process_output(bg, wait_s=0.05)["waiting_for_input"]:
            return True
    return False


if __name__ == "__main__":
    print(f"toolsd bench on {os.cpu_count()} cores, python {sys.version.split()[0]}")
    bench_waiting()
