#!/usr/bin/env python3
"""toolsd.cluster on a simulated Ray cluster (ray.cluster_utils.Cluster on this machine).

1. Session open through the cluster (a lease's placement group placed by Ray, the node
   agent opening the session with the lease's token) next to a direct `session.open` over TLS on one daemon,
   in the same run (goal: within 3x).
2. The figure of record: CLUSTER_SESSIONS (default 1,000) sessions across 5 simulated
   nodes, all answering a `shell.run`; open time p50/p99 and memory per session (the
   machine's used memory before and after, over the sessions: their sandboxes and what the
   daemons hold for them; a lease starts no process). Heavy: run it only on a quiet machine with the memory for it
   (CLUSTER_SESSIONS=200 for a smaller run; CLUSTER_SESSIONS=0 skips it).

Run: .venv/bin/python scripts/bench_cluster.py   (scripts/bench.py runs it as `cluster`)
"""

from __future__ import annotations

import concurrent.futures
import os
import statistics
import sys
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench import ms, report  # noqa: E402

from tests._cluster import simulated_cluster  # noqa: E402
from toolsd.client import Client  # noqa: E402

OPENS = 20
NODES = 5


def pct(samples: list[float], q: float) -> float:
    samples = sorted(samples)
    return samples[min(len(samples) - 1, int(len(samples) * q))]


def bench_cluster() -> None:
    try:
        import ray  # noqa: F401
    except ImportError:
        print("cluster: ray is not installed (pip install toolsd[cluster]); skipped")
        return
    from toolsd.cluster import Cluster

    with simulated_cluster() as (sim, root):
        toolsd = Cluster(root=root)
        try:
            compare_open(sim, toolsd)
            many = int(os.environ.get("CLUSTER_SESSIONS", "1000"))
            if many:
                many_sessions(sim, toolsd, many)
        finally:
            toolsd.down()


def compare_open(sim, toolsd) -> None:
    sim.add_node(OPENS + 5)
    status = toolsd.up()
    node = status["nodes"][0]
    # Direct: session.open on that very daemon, with a lease's token (so the same TLS path).
    probe = toolsd.open_session()
    direct = []
    with Client(probe.url, token=probe.token, fingerprint=probe.fingerprint) as c:
        for _ in range(OPENS):
            t = time.perf_counter()
            s = c.session_open()["session"]
            direct.append(time.perf_counter() - t)
            c.session_close(s)
    through = []
    for _ in range(OPENS):
        t = time.perf_counter()
        h = toolsd.open_session()
        through.append(time.perf_counter() - t)
        h.close()
    probe.close()
    d, c = statistics.median(direct), statistics.median(through)
    report("cluster: session.open direct over TLS p50", ms(d))
    report("cluster: open_session through Ray p50", ms(c), anchor=ms(d).strip(), ratio=c / d,
           target="goal: within 3x")
    report("cluster: open_session through Ray p90", ms(pct(through, 0.9)))
    assert node["url"]


# What one session may cost here (its sandbox, the daemon's share), with room to spare:
# below this much free memory per session the run would push the machine into swap or OOM.
NEEDS_PER_SESSION = 16 * 2**20


def many_sessions(sim, toolsd, count: int) -> None:
    free = psutil.virtual_memory().available
    if free < count * NEEDS_PER_SESSION:
        print(f"cluster: {count} sessions need about {count * NEEDS_PER_SESSION / 2**30:.0f} "
              f"GiB free, {free / 2**30:.0f} GiB are: skipped (CLUSTER_SESSIONS=N for fewer)")
        return
    # One node is up already, from compare_open (OPENS + 5 slots): the others take the rest,
    # with a few to spare (a session waits for a free slot, so too few would hang the run).
    per_node = -(-(count - OPENS - 5) // (NODES - 1)) + 10
    for _ in range(NODES - 1):
        sim.add_node(per_node)
    toolsd.up()
    before = psutil.virtual_memory().used
    opened: list[float] = []

    def open_one(_):
        t = time.perf_counter()
        h = toolsd.open_session()
        opened.append(time.perf_counter() - t)
        return h

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        handles = list(pool.map(open_one, range(count)))
        wall = time.perf_counter() - t0

        def answer(h):
            with Client(h.url, token=h.token, fingerprint=h.fingerprint) as c:
                return c.shell_run(h.session, "echo ok")["output"].strip() == "ok"

        answered = sum(pool.map(answer, handles))
        after = psutil.virtual_memory().used
        list(pool.map(lambda h: h.close(), handles))
    nodes = len({h.node for h in handles})
    report(f"cluster: {count} sessions on {nodes} nodes, answered shell.run",
           f"{answered:8d}")
    report("cluster: open_session under load p50", ms(statistics.median(opened)))
    report("cluster: open_session under load p99", ms(pct(opened, 0.99)))
    report(f"cluster: all {count} opened in", f"{wall:8.1f} s")
    report("cluster: memory per session (machine used / sessions)",
           f"{(after - before) / count / 2**20:8.1f} MiB")


if __name__ == "__main__":
    bench_cluster()
