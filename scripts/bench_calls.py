#!/usr/bin/env python3
"""What one shell.run('true') costs in counts that a busy machine does not move: the system
calls of the daemon (its scheduler passes among them: one epoll_wait each) and of the
sandbox's launcher and shims (the command itself not counted), next to the daemon's for a
`hello` in the same run. Counted by `strace -c` attached to the running processes.

Run: .venv/bin/python scripts/bench.py calls   (with --tree, each tree's daemon and launcher)
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench  # noqa: E402
from bench import report, running_daemon  # noqa: E402

from toolsd.client import Client  # noqa: E402

CALLS = 200
# A line of `strace -c`'s table: ... calls [errors] syscall
ROW = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$")


def counted(pids: list[int], follow_threads: bool, fn, n: int) -> dict[str, float]:
    """System calls per call of `fn` made by `pids`, by name. `follow_threads`: strace's -f,
    which counts their threads, and would count a child they forked meanwhile (the daemon
    forks none for a shell.run; the shims fork the commands, so they go without it)."""
    with tempfile.NamedTemporaryFile(prefix="toolsd-bench-strace-") as out:
        strace = subprocess.Popen(
            ["strace", "-c", *(["-f"] if follow_threads else []), "-o", out.name,
             *[arg for pid in pids for arg in ("-p", str(pid))]],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # strace says it is attached on stderr, once per process (and thread).
        for _ in pids:
            strace.stderr.readline()
        for _ in range(n):
            fn()
        time.sleep(0.2)  # what the last call set going (the shim's release) is counted too
        strace.send_signal(signal.SIGINT)
        strace.wait()
        rows = [ROW.match(line) for line in open(out.name)]
    return {m.group(2): int(m.group(1)) / n for m in rows if m and m.group(2) != "total"}


def summary(counts: dict[str, float]) -> str:
    return f"{sum(counts.values()):8.1f}"


def bench_calls() -> None:
    if shutil.which("strace") is None:
        print("  (no strace: the counts are left out)")
        return
    import psutil

    with running_daemon("--no-warm-spare") as (sock, root, proc):
        workspace = os.path.join(root, "ws")
        os.makedirs(workspace)
        with Client(sock) as c:
            session = c.session_open(workspace)["session"]
            for _ in range(50):
                c.shell_run(session, "true")
            hello = counted([proc.pid], True, c.hello, CALLS)
            daemon = counted([proc.pid], True, lambda: c.shell_run(session, "true"), CALLS)
            # Not their children (the commands), so the shims are listed now: one forked
            # later would go uncounted (clone3 below 1.0 a call says so).
            sandbox = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)
                       if p.name() in ("toolsd-init", "toolsd-shim")]
            inside = counted(sandbox, False, lambda: c.shell_run(session, "true"), CALLS)
    report("system calls of the daemon per shell.run('true')", summary(daemon),
           anchor=f"hello {summary(hello)}", ratio=sum(daemon.values()) / sum(hello.values()))
    report("scheduler passes of the daemon per shell.run('true')",
           f"{daemon.get('epoll_wait', 0):8.1f}", anchor=f"hello {hello.get('epoll_wait', 0):.1f}")
    report("system calls of the launcher and shims per shell.run", summary(inside),
           anchor=f"spawns seen {inside.get('clone3', 0):.2f} a call")
    tree = f" ({bench.TREE})" if bench.TREE else ""
    for who, counts in ((f"daemon{tree}", daemon), (f"launcher and shims{tree}", inside)):
        print(f"  {who}: " + ", ".join(f"{name} {n:.1f}" for name, n in
                                       sorted(counts.items(), key=lambda kv: -kv[1])))


if __name__ == "__main__":
    print(f"toolsd bench on {os.cpu_count()} cores, python {sys.version.split()[0]}")
    bench_calls()
