#!/usr/bin/env python3
"""Background processes: how fast a whole tree is stopped, and how soon a waiting
process.output sees a line. Each figure next to an anchor measured on this machine just before.

Run: .venv/bin/python scripts/bench_processes.py   (scripts/bench.py runs it as a section)
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench import ms, report, running_daemon, stats  # noqa: E402

import trio  # noqa: E402

from toolsd.client import Client  # noqa: E402
from toolsd.sandbox.launch import proctree  # noqa: E402
from toolsd.sandbox.launch.launcher_client import Launcher  # noqa: E402
from toolsd.sandbox.launch.spawn_request import SpawnRequest  # noqa: E402

TREE_SIZE = 200
STOP_RUNS = 5
LATENCY_SAMPLES = 200

# A tree of TREE_SIZE processes, the main one included: children (every other one in its own
# session) with grandchildren, a few of which double-fork away so that only the shim is their
# ancestor. "ready" is printed once every process exists (each says so on a pipe).
TREE = textwrap.dedent("""
    import os, sys, time
    total = int(sys.argv[1])
    r, w = os.pipe()
    def linger():
        os.write(w, b"x")
        time.sleep(10000)
        os._exit(0)
    made = 1
    child = 0
    while made < total:
        kids = min(9, total - made - 1)
        if os.fork() == 0:
            if child % 2:
                os.setsid()
            for k in range(kids):
                if os.fork() == 0:
                    if k == 0 and child % 3 == 0:
                        if os.fork():  # double fork: the middle one leaves at once
                            os._exit(0)
                    linger()
            linger()
        made += kids + 1
        child += 1
    for _ in range(total - 1):
        os.read(r, 1)
    print("ready", flush=True)
    time.sleep(10000)
""")

TICKER = textwrap.dedent("""
    import sys, time
    for _ in range(int(sys.argv[1])):
        sys.stdout.write("T %.6f\\n" % time.time())
        sys.stdout.flush()
        time.sleep(0.01)
""")


def bench_processes() -> None:
    anchor_stop = direct_kill_time(TREE_SIZE)
    kills = [trio.run(kill_tree_time, TREE_SIZE) for _ in range(STOP_RUNS)]
    report(f"proctree.kill_tree of a {TREE_SIZE}-process tree, SIGTERM path, median",
           ms(stats(kills)[0]), anchor=f"os.kill+waitpid of {TREE_SIZE} children {ms(anchor_stop)}",
           ratio=stats(kills)[0] / anchor_stop)
    anchor_line = pipe_line_latency(LATENCY_SAMPLES)
    with running_daemon() as (sock, root, _proc):
        workspace = os.path.join(root, "ws")
        os.makedirs(workspace)
        with Client(sock) as c:
            session = c.session_open(workspace)["session"]
            stops = [stop_tree(c, session, TREE_SIZE) for _ in range(STOP_RUNS)]
            latencies, late = line_latency(c, session, LATENCY_SAMPLES)
            c.session_close(session)
    stop_median, _ = stats(stops)
    report(f"process.stop of a {TREE_SIZE}-process tree, median", ms(stop_median),
           anchor=f"os.kill+waitpid of {TREE_SIZE} children {ms(anchor_stop)}",
           ratio=stop_median / anchor_stop, target="< 300 ms")
    median, p90 = stats(latencies)
    a_median, a_p90 = stats(anchor_line)
    report("line -> waiting process.output (until), median", ms(median),
           anchor=f"bare pipe {ms(a_median)}", ratio=median / a_median, target="< 5 ms")
    report("line -> waiting process.output (until), p90", ms(p90),
           anchor=f"bare pipe {ms(a_p90)}", ratio=p90 / a_p90)
    r_median, _ = stats(relay_line_latency(LATENCY_SAMPLES))
    report("line -> waiting process.output (until), median, next to a relay", ms(median),
           anchor=f"trio relay {ms(r_median)}", ratio=median / r_median)
    if late:
        print(f"  ({late} of {LATENCY_SAMPLES} lines were already there when the read "
              f"started; left out)")


def stop_tree(c: Client, session: str, size: int) -> float:
    """Seconds from sending process.stop until it answers with every process ended."""
    bg = c.process_start(session, f"{sys.executable} -c {_quote(TREE)} {size}")
    out = c.process_output(bg["id"], wait_s=120, until="ready")
    if "ready" not in out["output"]:
        raise SystemExit(f"the process tree did not start: {out}")
    started = time.perf_counter()
    result = c.process_stop(bg["id"])
    elapsed = time.perf_counter() - started
    if result["survivors"] != 0 or result["ended"] < size:
        raise SystemExit(f"stop left processes or missed some: {result}")
    return elapsed


def line_latency(c: Client, session: str, n: int) -> tuple[list[float], int]:
    """Seconds from a line's write (its own timestamp) until a read waiting for it returns.
    A read that finds more than one line was late (the line did not wait for it): skipped."""
    bg = c.process_start(session, f"{sys.executable} -c {_quote(TICKER)} {n}")
    samples, late = [], 0
    while True:
        r = c.process_output(bg["id"], wait_s=10, until=r"\n")
        now = time.time()
        lines = r["output"].splitlines()
        if len(lines) == 1 and lines[0].startswith("T "):
            samples.append(now - float(lines[0][2:]))
        elif lines:
            late += len(lines)
        if r["status"] != "running" and not lines:
            break
    return samples, late


async def kill_tree_time(size: int) -> float:
    """Seconds of proctree.kill_tree over the TREE under an unsandboxed launcher's shim (a
    subreaper, so the double-forked ones are in its tree), without a daemon."""
    async with trio.open_nursery() as nursery:
        launcher = await Launcher.start(nursery, wrapper=[], env={"PATH": os.environ["PATH"]})
        try:
            read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
            try:
                job = await launcher.spawn(SpawnRequest(
                    [sys.executable, "-c", TREE, str(size)], cwd="/",
                    env={"PATH": os.environ["PATH"]}, stdin=0, stdout=write_fd, stderr=2))
            finally:
                os.close(write_fd)
            async with trio.lowlevel.FdStream(read_fd) as out:
                data = b""
                while b"ready" not in data:
                    chunk = await out.receive_some()
                    if not chunk:
                        raise SystemExit(f"the process tree did not start: {data!r}")
                    data += chunk
                started = time.perf_counter()
                ended, survivors = await trio.to_thread.run_sync(
                    lambda: proctree.kill_tree(job.shim_pid, grace_s=2, include_root=False))
                elapsed = time.perf_counter() - started
            if survivors or ended < size:
                raise SystemExit(f"kill_tree left processes or missed some: {ended}, {survivors}")
            await job.wait()
            return elapsed
        finally:
            await launcher.aclose()


def direct_kill_time(size: int) -> float:
    """Anchor: SIGKILL `size` sleeping children of ours and reap them, median of runs."""
    runs = []
    for _ in range(STOP_RUNS):
        pids = []
        for _ in range(size):
            pid = os.fork()
            if pid == 0:
                time.sleep(10000)
                os._exit(0)
            pids.append(pid)
        started = time.perf_counter()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        for pid in pids:
            os.waitpid(pid, 0)
        runs.append(time.perf_counter() - started)
    return stats(runs)[0]


def pipe_line_latency(n: int) -> list[float]:
    """Anchor: the same ticker writing into a bare pipe that we block on."""
    proc = subprocess.Popen([sys.executable, "-c", TICKER, str(n)], stdout=subprocess.PIPE)
    fd = proc.stdout.fileno()
    samples = _line_latencies(lambda: os.read(fd, 65536))
    proc.wait()
    return samples


def _line_latencies(read) -> list[float]:
    """Seconds from each ticker line's own timestamp until `read()` returned it, for the
    reads that returned one line alone, until `read()` returns nothing (its end)."""
    samples, buf = [], b""
    while data := read():
        now = time.time()
        buf += data
        *lines, buf = buf.split(b"\n")
        if len(lines) == 1:
            samples.append(now - float(lines[0][2:]))
    return samples


def relay_line_latency(n: int) -> list[float]:
    """Anchor for any daemon in the middle: the ticker's pipe read by a trio process of its
    own, which writes each chunk to a socket that we block on (two wakeups, as through
    toolsd, and no work between them)."""
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the relay
        ours.close()
        try:
            trio.run(_relay, theirs.fileno(), n)
        finally:
            os._exit(0)
    theirs.close()
    with ours:
        samples = _line_latencies(lambda: ours.recv(65536))
    os.waitpid(pid, 0)
    return samples


async def _relay(out_fd: int, n: int) -> None:
    proc = subprocess.Popen([sys.executable, "-c", TICKER, str(n)], stdout=subprocess.PIPE)
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    while True:
        await trio.lowlevel.wait_readable(fd)
        if not (data := os.read(fd, 65536)):
            break
        os.write(out_fd, data)
    proc.wait()


def _quote(text: str) -> str:
    return shlex.quote(text)


if __name__ == "__main__":
    print(f"toolsd bench on {os.cpu_count()} cores, python {sys.version.split()[0]}")
    bench_processes()
