#!/usr/bin/env python3
"""The persistent REPL: what one repl.exec costs next to the usual ways of running Python from
an agent, and what loading data once saves. Every figure is measured in the same run as its
anchors.

Run: .venv/bin/python scripts/bench_repl.py   (scripts/bench.py runs it as a section)
Needs the bench extra (jupyter_client, ipykernel): pip install -e '.[bench]'; without them
the jupyter line says so and the rest still runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench import (  # noqa: E402
    ms, on_one_core, report, running_daemon, stats, timed, trio_echo, us)

from driver import PYTHON_REPL  # noqa: E402
from toolsd.client import Client  # noqa: E402
from toolsd.tools.sentinel import SentinelScanner  # noqa: E402

# The interpreter binary itself, not a version manager's shim in front of it: every anchor
# and the sandboxed REPL then run the same Python.
PYTHON = os.path.realpath(sys.executable)
DRIVER = PYTHON_REPL

ROUND_TRIPS = 2000
JUPYTER_ROUND_TRIPS = 300
SLOW_ROUND_TRIPS = 30  # replwrap and python3 -c take milliseconds each

CSV_ROWS = 200_000
QUERIES = 20
LOAD = ("import csv\n"
        "with open('data.csv', newline='') as f:\n"
        "    rows = [(int(r[0]), r[1], float(r[2])) for r in csv.reader(f)]")
QUERY = "round(sum(a for _, c, a in rows if c == 'city{}'), 2)"


# ------------------------------------------------------------------ round trip


ROUNDS = 5  # toolsd, the bare pipe and jupyter take turns, so that drift hits them alike


def bench_repl() -> None:
    toolsd, bare, echo, jupyter = [], [], [], []
    with contextlib.ExitStack() as stack:
        sock, root, _proc = stack.enter_context(running_daemon())
        workspace = os.path.join(root, "ws")
        os.makedirs(workspace)
        c = stack.enter_context(Client(sock))
        session = c.session_open(workspace)["session"]
        turn = c.turn_begin(session)["turn"]
        c.repl_exec(session, turn, "x = 0")  # the interpreter's start is not a round trip
        toolsd_one = lambda: c.repl_exec(session, turn, "x = 1")  # noqa: E731
        bare_one = stack.enter_context(bare_pipe())
        echo_one = stack.enter_context(trio_echo(root)).hello
        jupyter_one = stack.enter_context(jupyter_kernel())
        for _ in range(ROUNDS):
            toolsd += timed(toolsd_one, ROUND_TRIPS // ROUNDS, warmup=50)
            bare += timed(bare_one, ROUND_TRIPS // ROUNDS, warmup=50)
            echo += timed(echo_one, ROUND_TRIPS // ROUNDS, warmup=50)
            if jupyter_one is not None:
                jupyter += timed(jupyter_one, JUPYTER_ROUND_TRIPS // ROUNDS, warmup=5)
        # The same, with every wakeup a switch (bench.on_one_core).
        one_core = on_one_core([toolsd_one, bare_one, echo_one], ROUNDS, ROUND_TRIPS // ROUNDS,
                               warmup=50)
    median, p90 = stats(toolsd)
    bare_median, bare_p90 = stats(bare)
    report('repl.exec("x = 1") round trip, median', us(median),
           anchor=f"bare pipe to the driver {us(bare_median)}", ratio=median / bare_median,
           target="< 150 us")
    report('repl.exec("x = 1") round trip, p90', us(p90),
           anchor=f"bare pipe to the driver {us(bare_p90)}", ratio=p90 / bare_p90)
    # The two hops alone: client to a bare trio server and back, daemon to the driver and
    # back. A daemon in between cannot take less than their sum.
    hops = stats(echo)[0] + bare_median
    report('repl.exec("x = 1") against its two hops alone', us(median),
           anchor=f"trio echo + bare pipe {us(hops)}", ratio=median / hops)
    if one_core is not None:
        median_1, bare_1, echo_1 = one_core
        hops_1 = bare_1 + echo_1
        report('repl.exec("x = 1") against its two hops, all on one core', us(median_1),
               anchor=f"trio echo + bare pipe {us(hops_1)}", ratio=median_1 / hops_1)
    if not jupyter:
        report("jupyter_client + ipykernel, execute to idle", "not installed",
               anchor="pip install -e '.[bench]'")
    else:
        j_median, _ = stats(jupyter)
        report("jupyter_client + ipykernel, execute to idle, median", ms(j_median),
               anchor=f"toolsd {us(median)}", ratio=j_median / median,
               target="ratio >= 20")
    rw_median, _ = stats(replwrap_round_trips(SLOW_ROUND_TRIPS))
    report("pexpect replwrap (python), median", ms(rw_median),
           anchor=f"toolsd {us(median)}", ratio=rw_median / median)
    pc_median, _ = stats(python_c_round_trips(SLOW_ROUND_TRIPS))
    report("python3 -c per call, median", ms(pc_median),
           anchor=f"toolsd {us(median)}", ratio=pc_median / median)
    bench_repl_start()


FRESH_TURNS = 15


def bench_repl_start() -> None:
    """The first repl.exec of a turn: the driver's start, in the sandbox, and its first
    answer; next to the bare interpreter starting on the host."""
    node = shutil.which("node")
    with running_daemon() as (sock, root, _proc):
        workspace = os.path.join(root, "ws")
        os.makedirs(workspace)
        with Client(sock) as c:
            session = c.session_open(workspace)["session"]
            for language, anchor_argv in (("python", [PYTHON, "-c", "pass"]),
                                          ("node", [node, "-e", "0"])):
                if language == "node" and node is None:
                    report("first repl.exec of a turn, node", "no node here")
                    continue
                firsts = []
                for _ in range(FRESH_TURNS):
                    turn = c.turn_begin(session)["turn"]
                    t = time.perf_counter()
                    r = c.repl_exec(session, turn, "x = 1", language=language)
                    firsts.append(time.perf_counter() - t)
                    assert r["fresh"] and r["status"] == "ok", r
                    c.turn_end(session, turn)
                bare = timed(lambda: subprocess.run(anchor_argv, check=True), FRESH_TURNS,
                             warmup=2)
                first, bare_median = stats(firsts)[0], stats(bare)[0]
                report(f"first repl.exec of a turn, {language}, median", ms(first),
                       anchor=f"{os.path.basename(anchor_argv[0])} {anchor_argv[1]} "
                              f"{anchor_argv[2]} {ms(bare_median)}",
                       ratio=first / bare_median)
            c.session_close(session)


@contextlib.contextmanager
def bare_pipe():
    """The driver on plain pipes, no daemon, no sandbox: the floor under repl.exec. Yields
    one round trip as a function."""
    uuid = "0" * 32
    cmd_r, cmd_w = os.pipe()
    out_r, out_w = os.pipe()
    # close_fds=False so the fd 3 made in the child survives; our other fds are
    # close-on-exec (PEP 446).
    proc = subprocess.Popen([PYTHON, DRIVER], stdin=subprocess.DEVNULL, stdout=out_w,
                            stderr=out_w, close_fds=False,
                            preexec_fn=lambda: os.dup2(cmd_r, 3))
    os.close(cmd_r)
    os.close(out_w)
    os.write(cmd_w, uuid.encode() + b"\n")
    scanner = SentinelScanner(uuid)
    seq = 0
    line = json.dumps("x = 1").encode() + b"\n"

    def one():
        nonlocal seq
        seq += 1
        scanner.expect(seq)
        os.write(cmd_w, line)
        while True:
            _out, sentinel = scanner.feed(os.read(out_r, 65536))
            if sentinel is not None:
                return

    try:
        yield one
    finally:
        os.close(cmd_w)  # end of commands: the driver exits
        proc.wait(timeout=30)
        os.close(out_r)


@contextlib.contextmanager
def jupyter_kernel():
    """One execute-to-idle round trip as a function, or None without jupyter_client."""
    try:
        from jupyter_client.manager import KernelManager
    except ImportError:
        yield None
        return
    # IPC transport: jupyter's fastest local setup (and no warning about plain TCP).
    km = KernelManager(kernel_name="python3", transport="ipc")
    km.start_kernel(stderr=subprocess.DEVNULL)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        yield lambda: kc.execute_interactive("x = 1", timeout=30)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def replwrap_round_trips(n: int) -> list[float]:
    from pexpect import replwrap

    repl = replwrap.python(PYTHON)
    try:
        # replwrap as it comes: pexpect waits delaybeforesend (50 ms) before each send.
        return timed(lambda: repl.run_command("x = 1"), n, warmup=3)
    finally:
        repl.child.close(force=True)


def python_c_round_trips(n: int) -> list[float]:
    return timed(lambda: subprocess.run([PYTHON, "-c", "x = 1"], check=True), n, warmup=3)


# ------------------------------------------------------------------ load once, query many


def bench_load_once() -> None:
    with running_daemon() as (sock, root, _proc):
        workspace = os.path.join(root, "ws")
        os.makedirs(workspace)
        write_csv(os.path.join(workspace, "data.csv"), CSV_ROWS)
        with Client(sock) as c:
            session = c.session_open(workspace)["session"]
            turn = c.turn_begin(session)["turn"]
            started = time.perf_counter()
            loaded = c.repl_exec(session, turn, LOAD, timeout_s=300)
            load_s = time.perf_counter() - started
            assert loaded["status"] == "ok", loaded["output"]
            repl_answers = []
            query_times = []
            for i in range(QUERIES):
                t = time.perf_counter()
                r = c.repl_exec(session, turn, QUERY.format(i))
                query_times.append(time.perf_counter() - t)
                repl_answers.append(r["output"].strip())
            repl_s = load_s + sum(query_times)

            # The sandbox's python3 itself (what the REPL runs on), not a shim in front of it.
            python = c.shell_run(session, "python3 -c 'import sys; print(sys.executable)'")
            python = python["output"].strip()
            shell_answers = []
            started = time.perf_counter()
            for i in range(QUERIES):
                script = f"{LOAD}\nprint({QUERY.format(i)})"
                r = c.shell_run(session, f"{python} -c {shell_quote(script)}", timeout_s=300)
                assert r["exit_code"] == 0, r["output"]
                shell_answers.append(r["output"].strip())
            shell_s = time.perf_counter() - started
            c.session_close(session)
    if repl_answers != shell_answers:
        raise SystemExit(f"the two ways disagree: {repl_answers} vs {shell_answers}")
    q_median, _ = stats(query_times)
    report(f"load {CSV_ROWS:,} CSV rows once, {QUERIES} repl.exec queries", ms(repl_s),
           anchor=f"{QUERIES} shell.run python3 -c reloading {ms(shell_s)}",
           ratio=shell_s / repl_s)
    report("  of which the load (interpreter start included)", ms(load_s),
           anchor=f"one query {ms(q_median)}")


def write_csv(path: str, rows: int) -> None:
    rng = random.Random(4)
    with open(path, "w") as f:
        for i in range(rows):
            f.write(f"{i},city{rng.randrange(50)},{rng.uniform(0, 1000):.2f}\n")


def shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


if __name__ == "__main__":
    print(f"toolsd bench on {os.cpu_count()} cores, python {sys.version.split()[0]}")
    bench_repl()
    bench_load_once()
