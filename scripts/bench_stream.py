#!/usr/bin/env python3
"""Live output (protocol 1.1 "stream"): a shell.run flood drained with its output streamed as
events, next to the same flood without, measured in the same run; and the daemon's memory
while it streams.

Run: .venv/bin/python scripts/bench_stream.py   (scripts/bench.py runs it as the section
`stream`)
"""

from __future__ import annotations

import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench import report, running_daemon  # noqa: E402

from toolsd.client import Client  # noqa: E402

SIZE = 256_000_000
RUNS = 3  # each way, alternating; the best of each is reported


def bench_stream() -> None:
    import psutil

    command = f"yes | head -c {SIZE}"
    with running_daemon("--no-warm-spare") as (sock, root, proc):
        workspace = os.path.join(root, "ws")
        os.makedirs(workspace)
        daemon = psutil.Process(proc.pid)
        with Client(sock) as c:
            session = c.session_open(workspace)["session"]
            c.shell_run(session, "true")
            rss_before = daemon.memory_info().rss
            best = {False: float("inf"), True: float("inf")}
            for _ in range(RUNS):
                for stream in (False, True):
                    got = [0]

                    def count(event, got=got) -> None:
                        got[0] += len(event.data)

                    t = time.perf_counter()
                    r = c.shell_run(session, command, max_output_chars=1000, timeout_s=600,
                                    on_event=count if stream else None)
                    best[stream] = min(best[stream], time.perf_counter() - t)
                    assert r["output_bytes"] == SIZE and got[0] == (SIZE if stream else 0)
            growth = daemon.memory_info().rss - rss_before
            c.session_close(session)
    plain, streamed = SIZE / best[False] / 1e6, SIZE / best[True] / 1e6
    report("drain rate of yes | head -c 256 MB, stream: true", f"{streamed:8.0f} MB/s",
           anchor=f"without stream {plain:.0f} MB/s", ratio=streamed / plain)
    report("daemon RSS growth over the floods", f"{growth / 1e6:8.1f} MB", target="< 32 MB")


if __name__ == "__main__":
    bench_stream()
