#!/usr/bin/env python3
"""Many sessions at once: N sessions on distinct workspaces, each with a REPL, driven by 16
concurrent clients doing shell.run("echo hi") and repl.exec alternately. Latencies under load
are shown next to the same calls unloaded, measured in the same run with the N sessions open.

Run: .venv/bin/python scripts/bench.py load [--sessions N] [--clients N]   (default 200, 16)
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench import ms, report, running_daemon, timed  # noqa: E402

from toolsd.client import Client  # noqa: E402

CALLS_PER_METHOD = 2000  # under load, over all clients (rounds over the sessions to get there)
UNLOADED_CALLS = 200
OPENERS = 4  # session opens and REPL starts in flight at once
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


def machine_busy_s() -> float:
    times = psutil.cpu_times()
    return times.user + times.nice + times.system + times.irq + times.softirq + getattr(
        times, "steal", 0.0)


def bench_load(sessions: int = 200, clients: int = 16) -> None:
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

        with ThreadPoolExecutor(OPENERS) as pool:
            started = time.perf_counter()
            opened = list(pool.map(open_one, range(sessions)))
            open_s = time.perf_counter() - started
        idle_uss = statistics.median(sandbox_uss(proc.pid))

        def start_repl(pair: tuple[str, str]) -> None:
            r = client().repl_exec(*pair, "x = 0")
            assert r["status"] == "ok", r

        with ThreadPoolExecutor(OPENERS) as pool:
            list(pool.map(start_repl, opened))
        fds = daemon.num_fds()

        # The anchors: the same calls on one of the N sessions, with nothing else going on.
        c = client()
        s0, t0 = opened[0]
        shell_unloaded = statistics.median(timed(lambda: c.shell_run(s0, SHELL), UNLOADED_CALLS))
        repl_unloaded = statistics.median(timed(lambda: c.repl_exec(s0, t0, REPL),
                                                UNLOADED_CALLS))

        rounds = math.ceil(CALLS_PER_METHOD / sessions)
        latencies: dict[str, list[float]] = {"shell": [], "repl": []}
        errors: list[str] = []
        lock = threading.Lock()

        def drive(k: int) -> None:
            mine = opened[k::clients]
            c = Client(sock, timeout=600)
            shell, repl, failed = [], [], []
            with c:
                for _ in range(rounds):
                    for s, turn in mine:
                        t = time.perf_counter()
                        try:
                            r = c.shell_run(s, SHELL)
                            if r["output"] != "hi\n":
                                failed.append(f"shell.run on {s}: {r}")
                        except Exception as e:
                            failed.append(f"shell.run on {s}: {e}")
                        shell.append(time.perf_counter() - t)
                        t = time.perf_counter()
                        try:
                            r = c.repl_exec(s, turn, REPL)
                            if r["status"] != "ok":
                                failed.append(f"repl.exec on {s}: {r}")
                        except Exception as e:
                            failed.append(f"repl.exec on {s}: {e}")
                        repl.append(time.perf_counter() - t)
            with lock:
                latencies["shell"] += shell
                latencies["repl"] += repl
                errors.extend(failed)

        me = psutil.Process()
        cpu_before = sum(daemon.cpu_times()[:2])
        tree_before, me_before = tree_cpu_s(daemon), sum(me.cpu_times()[:2])
        busy_before = machine_busy_s()
        started = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(drive, range(clients)))
        wall = time.perf_counter() - started
        daemon_cpu = sum(daemon.cpu_times()[:2]) - cpu_before
        busy = machine_busy_s() - busy_before
        tree_cpu = tree_cpu_s(daemon) - tree_before
        clients_cpu = sum(me.cpu_times()[:2]) - me_before
        loaded_uss = statistics.median(sandbox_uss(proc.pid))

    calls = len(latencies["shell"]) + len(latencies["repl"])
    shell_p50, shell_p99 = (percentile(latencies["shell"], q) for q in (0.5, 0.99))
    repl_p50, repl_p99 = (percentile(latencies["repl"], q) for q in (0.5, 0.99))
    name = f"load: {sessions} sessions, {clients} clients"
    report(f"{name}, session.open each ({OPENERS} at once)", ms(open_s / sessions))
    report(f"{name}, calls/s", f"{calls / wall:8.0f}/s",
           anchor=f"{calls} calls in {wall:.1f} s")
    report('  shell.run("echo hi") under load, p50', ms(shell_p50),
           anchor=f"unloaded median {ms(shell_unloaded)}", ratio=shell_p50 / shell_unloaded)
    report('  shell.run("echo hi") under load, p99', ms(shell_p99),
           anchor=f"unloaded median {ms(shell_unloaded)}", ratio=shell_p99 / shell_unloaded,
           target="< 10 x")
    report(f'  repl.exec("{REPL}") under load, p50', ms(repl_p50),
           anchor=f"unloaded median {ms(repl_unloaded)}", ratio=repl_p50 / repl_unloaded)
    report(f'  repl.exec("{REPL}") under load, p99', ms(repl_p99),
           anchor=f"unloaded median {ms(repl_unloaded)}", ratio=repl_p99 / repl_unloaded)
    report("  daemon CPU per call", ms(daemon_cpu / calls),
           anchor=f"daemon and sandboxes {ms(tree_cpu / calls)}")
    others = busy - tree_cpu - clients_cpu
    report("  machine busy during the load", f"{busy / wall:8.2f} cores",
           anchor=f"of {psutil.cpu_count()}: toolsd {tree_cpu / wall:.2f}, these clients "
                  f"{clients_cpu / wall:.2f}, anything else {others / wall:.2f}")
    report("  memory per session, idle (USS of its sandbox, median)",
           f"{idle_uss / 1e6:8.2f} MB", target="~2.6 MB")
    report("  memory per session with its REPL, after the load", f"{loaded_uss / 1e6:8.2f} MB")
    report("  daemon's open descriptors", f"{fds:8d}", anchor=f"{fds / sessions:.1f} a session")
    report("  errors", f"{len(errors):8d}", target="0")
    for line in errors[:ERRORS_SHOWN]:
        print(f"    {line[:300]}")


if __name__ == "__main__":
    bench_load(*map(int, sys.argv[1:3]))
