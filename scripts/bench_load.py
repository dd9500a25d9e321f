#!/usr/bin/env python3
"""Many sessions in one daemon: N sessions on distinct workspaces, 16 concurrent clients.

In one run, with the N sessions open: shell.run("echo hi") and repl.exec calls/s and
p50/p99 spread over the first 50 sessions, then over all N (a call should cost the same with
1,000 sessions as with 50); and the burst: every session without a REPL starting its first
one at once (a new turn's first repl.exec each) while the clients call shell.run on the 50
already running. Latencies are shown next to the same call unloaded, on one of the N.

Next to the burst's latencies, the same clients' over the 50 without it: the floor they are
held against (16 closed-loop clients on 2 cores wait behind each other). With each figure
over 50 and over N, the CPU a call took, and where the machine's CPU went that was neither
toolsd's nor the clients' (kernel threads, interrupts, steal, other processes).

Before all that, the floor a session costs the others: the daemon's CPU while every session
is idle and shell.run's unloaded median, with FEW sessions open and again with all N, and at
the end the close of all N, CLIENTS at once. With --no-burst only the first 50 get a REPL:
no burst and no repl.exec over all N (minutes shorter at N = 1,000).

Run: .venv/bin/python scripts/bench.py load [--sessions N] [--clients N] [--no-burst]
(default 200, 16)
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import threading
import time

import trio
from concurrent.futures import ThreadPoolExecutor

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench import ms, report, running_daemon, timed  # noqa: E402

from toolsd.client import AsyncClient, Client  # noqa: E402

CALLS_PER_PHASE = 2000  # of one method, over all clients (rounds over the sessions)
UNLOADED_CALLS = 200
OPENERS = 4  # session opens and the first 50 REPL starts in flight at once
BASE = 50  # the sessions the figures over N are held against
FEW = 10  # the sessions the idle figures over N are held against
IDLE_S = 5.0  # how long the daemon's CPU is watched with every session idle
BURST_CONNECTIONS = 8  # the burst's REPL starts all at once, over this many connections
SHELL = "echo hi"
REPL = "x += 1"
ERRORS_SHOWN = 5


def percentile(samples: list[float], q: float) -> float:
    samples = sorted(samples)
    return samples[min(len(samples) - 1, int(len(samples) * q))]


def sandbox_uss(daemon_pid: int) -> list[int]:
    """USS of each session's sandbox (the wrapper the daemon started and everything below it:
    bwrap, the launcher, its shims, the REPL), one figure per sandbox."""
    sizes = []
    for top in psutil.Process(daemon_pid).children():
        total = 0
        for proc in (top, *top.children(recursive=True)):
            try:
                total += proc.memory_full_info().uss
            except psutil.Error:
                pass  # ended while we looked
        sizes.append(total)
    return sizes


def tree_cpu_s(daemon: psutil.Process) -> float:
    """CPU seconds of the daemon and every process of its sandboxes: each live process's own,
    plus what the processes it has waited for used (a shim reaps its commands, the launcher
    its retired shims), so the commands that came and went are counted too."""
    total = 0.0
    for proc in (daemon, *daemon.children(recursive=True)):
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def outside_cpu_s(ours: set[int]) -> dict[int, tuple[str, float]]:
    """{pid: (name, CPU seconds so far)} of every process outside `ours`, kernel threads
    (kthreadd's children) named `[name]`: where the machine's CPU went that was not toolsd's
    or these clients'."""
    seen = {}
    for proc in psutil.process_iter(["name", "ppid", "cpu_times"]):
        info = proc.info
        if proc.pid in ours or info["cpu_times"] is None:
            continue
        name = info["name"].split("/")[0].rstrip("0123456789:.-")
        if info["ppid"] == 2 or proc.pid == 2:
            name = f"[{name}]"
        seen[proc.pid] = (name, info["cpu_times"].user + info["cpu_times"].system)
    # Not any process's: interrupts, and what the hypervisor gave other machines.
    times = psutil.cpu_times()
    seen[-1] = ("[irq]", times.irq + times.softirq)
    seen[-2] = ("[steal]", getattr(times, "steal", 0.0))
    return seen


def outside_cpu_split(before: dict, after: dict, outside_s: float, wall: float) -> str:
    """Where `outside_s`, the machine's CPU outside toolsd and the clients over a phase, went,
    in cores: the largest of the kernel threads (by name), interrupts, steal and the other
    processes alive through the phase; and the rest, unattributed: processes that came and
    went meanwhile, and what of toolsd's own processes tree_cpu_s missed (`perf record -a`
    with the fork events says which: at 1,000 sessions most of it is toolsd's)."""
    by_name: dict[str, float] = {}
    for pid, (name, cpu) in after.items():
        if pid in before and before[pid][0] == name:
            key = name if name.startswith("[") else "other processes"
            by_name[key] = by_name.get(key, 0.0) + cpu - before[pid][1]
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:4]
    rest = outside_s - sum(by_name.values())
    return ", ".join(f"{name} {cpu / wall:.2f}" for name, cpu in [*top, ("unattributed", rest)])


def machine_busy_s() -> float:
    times = psutil.cpu_times()
    return times.user + times.nice + times.system + times.irq + times.softirq + getattr(
        times, "steal", 0.0)


class Phase:
    """Calls made by `clients` threads, each with its own connection, over its share of the
    sessions: the latency of each, the errors, and the wall time."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.wall = 0.0
        self._lock = threading.Lock()

    def run(self, sock: str, pairs, clients: int, method: str, calls: int = 0,
            until: threading.Event | None = None) -> Phase:
        """`calls` calls in all, or (with `until`) calls until it is set."""
        per_client = math.ceil(calls / clients) if calls else 0

        def drive(k: int) -> None:
            mine = pairs[k::clients] or pairs
            lats, failed = [], []
            with Client(sock, timeout=600) as c:
                n = 0
                while (n < per_client) if until is None else not until.is_set():
                    s, turn = mine[n % len(mine)]
                    n += 1
                    t = time.perf_counter()
                    try:
                        if method == "shell":
                            r = c.shell_run(s, SHELL)
                            bad = r["output"] != "hi\n"
                        else:
                            r = c.repl_exec(s, turn, REPL)
                            bad = r["status"] != "ok"
                        if bad:
                            failed.append(f"{method} on {s}: {r}")
                    except Exception as e:
                        failed.append(f"{method} on {s}: {e}")
                    lats.append(time.perf_counter() - t)
            with self._lock:
                self.latencies += lats
                self.errors += failed

        started = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(drive, range(clients)))
        self.wall = time.perf_counter() - started
        return self

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.wall

    def p(self, q: float) -> float:
        return percentile(self.latencies, q)


def burst_starts(sock: str, pairs) -> tuple[float, list[str]]:
    """Every pair's first repl.exec, all sent at once: the seconds until the last answered,
    and the errors."""
    errors: list[str] = []

    async def main() -> float:
        conns = [await AsyncClient.connect(sock) for _ in range(BURST_CONNECTIONS)]
        try:
            async def first(k: int, s: str, turn: str) -> None:
                try:
                    r = await conns[k % len(conns)].call("repl.exec", session=s, turn=turn,
                                                         code="x = 0", timeout=600)
                    if r["status"] != "ok":
                        errors.append(f"first repl.exec on {s}: {r}")
                except Exception as e:
                    errors.append(f"first repl.exec on {s}: {e}")

            started = trio.current_time()
            async with trio.open_nursery() as n:
                for k, (s, turn) in enumerate(pairs):
                    n.start_soon(first, k, s, turn)
            return trio.current_time() - started
        finally:
            for c in conns:
                await c.aclose()

    return trio.run(main), errors


def idle_cores(daemon: psutil.Process) -> float:
    """The daemon's CPU over IDLE_S with no call in flight, in cores."""
    before = sum(daemon.cpu_times()[:2])
    time.sleep(IDLE_S)
    return (sum(daemon.cpu_times()[:2]) - before) / IDLE_S


def bench_load(sessions: int = 200, clients: int = 16, burst: bool = True) -> None:
    with running_daemon("--no-warm-spare") as (sock, root, proc):
        daemon = psutil.Process(proc.pid)
        local = threading.local()

        def client() -> Client:
            if not hasattr(local, "client"):
                local.client = Client(sock, timeout=600)
            return local.client

        def open_one(i: int) -> tuple[str, str]:
            workspace = os.path.join(root, f"ws{i}")
            os.makedirs(workspace)
            s = client().session_open(workspace)["session"]
            return s, client().turn_begin(s)["turn"]

        def unloaded_shell() -> float:
            s = opened[0][0]
            return statistics.median(timed(lambda: client().shell_run(s, SHELL),
                                           UNLOADED_CALLS))

        few = min(FEW, sessions)
        with ThreadPoolExecutor(OPENERS) as pool:
            started = time.perf_counter()
            opened = list(pool.map(open_one, range(few)))
            open_s = time.perf_counter() - started
            idle = {few: idle_cores(daemon)}
            shell_idle = {few: unloaded_shell()}
            started = time.perf_counter()
            opened += pool.map(open_one, range(few, sessions))
            open_s += time.perf_counter() - started
            idle[sessions] = idle_cores(daemon)
            shell_idle[sessions] = unloaded_shell()
        idle_uss = statistics.median(sandbox_uss(proc.pid))
        base, rest = opened[:BASE], opened[BASE:]

        def start_repl(pair: tuple[str, str]) -> None:
            r = client().repl_exec(*pair, "x = 0")
            assert r["status"] == "ok", r

        with ThreadPoolExecutor(OPENERS) as pool:
            list(pool.map(start_repl, base))

        # The anchors: the same calls on one of the N sessions, with nothing else going on.
        c = client()
        s0, t0 = opened[0]
        shell_unloaded = statistics.median(timed(lambda: c.shell_run(s0, SHELL), UNLOADED_CALLS))
        repl_unloaded = statistics.median(timed(lambda: c.repl_exec(s0, t0, REPL),
                                                UNLOADED_CALLS))
        me = psutil.Process()

        def measured(pairs, m: str) -> tuple[Phase, list[float], str]:
            """`m` called over `pairs`, and the CPU seconds it took: the daemon's, toolsd's
            (the daemon and its sandboxes), these clients', the machine's; and where what was
            none of those went (outside_cpu_split)."""
            ours = {me.pid, daemon.pid, *(p.pid for p in daemon.children(recursive=True))}

            def now() -> tuple[float, ...]:
                return (sum(daemon.cpu_times()[:2]), tree_cpu_s(daemon),
                        sum(me.cpu_times()[:2]), machine_busy_s())

            outside, before = outside_cpu_s(ours), now()
            phase = Phase().run(sock, pairs, clients, m, CALLS_PER_PHASE)
            used = [b - a for a, b in zip(before, now())]
            tree_s, clients_s, busy_s = used[1:]
            split = outside_cpu_split(outside, outside_cpu_s(ours), busy_s - tree_s - clients_s,
                                      phase.wall)
            return phase, used, split

        over_base, cpu_base, outside_base = {}, {}, {}
        for m in ("shell", "repl"):
            over_base[m], cpu_base[m], outside_base[m] = measured(base, m)

        # The burst: the clients call shell.run on the 50 running sessions until every other
        # session's first repl.exec has been answered.
        done = threading.Event()
        during = Phase()
        burst_s, burst_errors = 0.0, []
        if burst:
            drivers = threading.Thread(target=during.run,
                                       args=(sock, base, clients, "shell", 0, done))
            drivers.start()
            time.sleep(0.5)  # the clients are calling
            try:
                burst_s, burst_errors = burst_starts(sock, rest) if rest else (0.0, [])
            finally:
                done.set()
                drivers.join()
        fds = daemon.num_fds()
        over_all, cpu, outside = {}, {}, {}
        methods = ("shell", "repl") if burst else ("shell",)
        for m in methods:
            over_all[m], cpu[m], outside[m] = measured(opened, m)
        loaded_uss = statistics.median(sandbox_uss(proc.pid))

        def close(pair: tuple[str, str]) -> None:
            client().session_close(pair[0])

        started = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(close, opened))
        close_s = time.perf_counter() - started
        # Their scratch and home folders go after the answers: until all of them have, the
        # closes still cost the machine.
        scratch = os.path.join(root, "state", "scratch")
        while os.listdir(scratch):
            time.sleep(0.05)
        removed_s = time.perf_counter() - started

    name = f"load: {sessions} sessions, {clients} clients"
    report(f"{name}, session.open each ({OPENERS} at once)", ms(open_s / sessions))
    report(f"  daemon CPU, {sessions} sessions idle", f"{idle[sessions]:8.3f} cores",
           anchor=f"{few} idle: {idle[few]:.3f} cores")
    report(f"  shell.run(\"{SHELL}\") unloaded, {sessions} sessions open",
           ms(shell_idle[sessions]), anchor=f"{few} open: {ms(shell_idle[few]).strip()}",
           ratio=shell_idle[sessions] / shell_idle[few])
    report("  memory per session, idle (USS of its sandbox, median)",
           f"{idle_uss / 1e6:8.2f} MB", target="<= 2.96 MB")
    unloaded = {"shell": shell_unloaded, "repl": repl_unloaded}
    calls = {"shell": f'shell.run("{SHELL}")', "repl": f'repl.exec("{REPL}")'}
    for m in methods:
        few, many = over_base[m], over_all[m]
        report(f"  {calls[m]} over {len(base)} sessions, calls/s", f"{few.rate:8.0f}/s",
               anchor=f"p50 {ms(few.p(0.5)).strip()}, p99 {ms(few.p(0.99)).strip()}")
        report(f"  {calls[m]} over {sessions} sessions, calls/s", f"{many.rate:8.0f}/s",
               anchor=f"over {len(base)}: {few.rate:.0f}/s", ratio=few.rate / many.rate,
               target="<= 1.3 x")
        for q in (0.5, 0.99):
            report(f"  {calls[m]} over {sessions} sessions, p{int(q * 100)}", ms(many.p(q)),
                   anchor=f"unloaded median {ms(unloaded[m]).strip()}",
                   ratio=many.p(q) / unloaded[m])

    def cpu_a_call(name: str, phase: Phase, used: list[float], split: str) -> None:
        daemon_s, tree_s, clients_s, busy_s = used
        n, wall = len(phase.latencies), phase.wall
        report(name, ms(daemon_s / n),
               anchor=f"daemon and sandboxes {ms(tree_s / n).strip()}; machine busy "
                      f"{busy_s / wall:.2f} cores: toolsd {tree_s / wall:.2f}, these clients "
                      f"{clients_s / wall:.2f}, else {(busy_s - tree_s - clients_s) / wall:.2f}"
                      f" ({split})")

    for m in methods:
        for over, phase, used, split in ((len(base), over_base[m], cpu_base[m], outside_base[m]),
                                         (sessions, over_all[m], cpu[m], outside[m])):
            cpu_a_call(f"  {calls[m]} over {over} sessions, daemon CPU a call", phase, used,
                       split)
    if burst:
        report(f"  burst: {len(rest)} first repl.exec at once, the last answered after",
               f"{burst_s:8.1f} s",
               anchor=f"{burst_s / max(1, len(rest)) * 1e3:.1f} ms a start")
        # What the same clients alone give, over the same sessions: the floor the burst's
        # figures are held against.
        alone = over_base["shell"]
        for q in (0.5, 0.99):
            report(f"  shell.run over {len(base)} sessions without the burst, p{int(q * 100)}",
                   ms(alone.p(q)), anchor=f"unloaded median {ms(shell_unloaded).strip()}",
                   ratio=alone.p(q) / shell_unloaded)
        for q, target in ((0.5, ""), (0.99, "<= 20 x")):
            report(f"  shell.run during the burst, p{int(q * 100)}", ms(during.p(q)),
                   anchor=f"unloaded median {ms(shell_unloaded).strip()}, "
                          f"{len(during.latencies)} calls",
                   ratio=during.p(q) / shell_unloaded, target=target)
        report("  memory per session with its REPL, after the load",
               f"{loaded_uss / 1e6:8.2f} MB")
    report(f"  session.close of all {sessions}, {clients} at once, each", ms(close_s / sessions),
           anchor=f"all closed in {close_s:.1f} s, their folders gone in {removed_s:.1f} s")
    report("  daemon's open descriptors", f"{fds:8d}", anchor=f"{fds / sessions:.1f} a session")
    errors = [*burst_errors, *during.errors,
              *(e for ph in (*over_base.values(), *over_all.values()) for e in ph.errors)]
    report("  errors", f"{len(errors):8d}", target="0")
    for line in errors[:ERRORS_SHOWN]:
        print(f"    {line[:300]}")


if __name__ == "__main__":
    bench_load(*map(int, sys.argv[1:3]), burst="--no-burst" not in sys.argv)
