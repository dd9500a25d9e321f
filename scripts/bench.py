#!/usr/bin/env python3
"""toolsd's speed, each figure printed next to its anchor measured in the same run.

Run: .venv/bin/python scripts/bench.py [section ...] [--sessions N] [--clients N] [--no-burst]
(sections: see SECTIONS below; the options are for `load`)
Two trees side by side: scripts/bench.py --tree ../before --tree . [--rounds N] [section ...]
runs the daemon of each tree in turn (rounds A B A B ...) and prints each figure for both,
min-max over the rounds. Only the daemon comes from each tree; the bench itself, its client
and the anchors are this tree's, so a figure that moves between the trees is the daemon's.
Timings live here, never in tests: machines are noisy, so every figure comes with a ratio to
something measured on the same machine a moment earlier.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import re
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import msgspec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from toolsd.client import Client  # noqa: E402


def stats(samples: list[float]) -> tuple[float, float]:
    samples = sorted(samples)
    return statistics.median(samples), samples[int(len(samples) * 0.9)]


def us(seconds: float) -> str:
    return f"{seconds * 1e6:8.1f} us"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.2f} ms"


# The tree whose daemon running_daemon starts (--tree); None: this one, as installed.
TREE: str | None = None
# With --tree: name -> tree -> the (value, anchor, ratio) of each round, printed at the end.
FIGURES: dict[str, dict[str, list]] | None = None
# Daemons started since the section began: a figure reported before any measured this tree's
# code whatever --tree says (the launcher section, in-process anchors).
SECTION_DAEMONS = 0
IN_PROCESS: set[str] = set()


def report(name: str, value: str, *, anchor: str = "", ratio: float | None = None,
           target: str = "") -> None:
    if FIGURES is not None:
        FIGURES.setdefault(name, collections.defaultdict(list))[TREE].append(
            (value, anchor, ratio))
        if not SECTION_DAEMONS:
            IN_PROCESS.add(name)
        return
    line = f"{name:<52} {value}"
    if anchor:
        line += f"   anchor {anchor}"
    if ratio is not None:
        line += f"   ratio {ratio:6.2f}"
    if target:
        line += f"   [{target}]"
    print(line, flush=True)


def timed(fn, n: int, warmup: int = 20) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


@contextlib.contextmanager
def running_daemon(*extra: str, env: dict[str, str] | None = None):
    root = tempfile.mkdtemp(prefix="toolsd-bench-", dir="/tmp")
    # The socket in a folder of its own: sessions may not open workspaces inside it.
    sock = os.path.join(root, "run", "toolsd.sock")
    global SECTION_DAEMONS
    SECTION_DAEMONS += 1
    # A tree on PYTHONPATH wins over the editable install's finder, which comes after it.
    tree_env = {"PYTHONPATH": TREE} if TREE else {}
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolsd", "serve", "--socket", sock,
         "--state-dir", os.path.join(root, "state"), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=TREE or ROOT,
        env={**os.environ, **(env or {}), **tree_env})
    line = proc.stdout.readline().decode()
    if "listening" not in line:
        raise SystemExit(f"toolsd did not start: {line!r}")
    try:
        yield sock, root, proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=600)  # a daemon with a thousand sessions closes them all first
        shutil.rmtree(root, ignore_errors=True)


# ------------------------------------------------------------------ hello

ECHO_SERVER = r"""
import os, struct, sys, trio, msgspec
path = sys.argv[1]
enc, dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()
async def handle(stream):
    buf = b""
    while True:
        data = await stream.receive_some(65536)
        if not data:
            return
        buf += data
        while len(buf) >= 4:
            (n,) = struct.unpack_from(">I", buf)
            if len(buf) < 4 + n:
                break
            req = dec.decode(buf[4:4 + n]); buf = buf[4 + n:]
            body = enc.encode({"id": req["id"], "result": {"protocol": 1}})
            await stream.send_all(struct.pack(">I", len(body)) + body)
async def main():
    sock = trio.socket.socket(trio.socket.AF_UNIX)
    await sock.bind(path); sock.listen(16)
    print("ready", flush=True)
    await trio.serve_listeners(handle, [trio.SocketListener(sock)])
trio.run(main)
"""


@contextlib.contextmanager
def trio_echo(folder: str):
    """A bare trio server answering every frame at once (the floor under a daemon round
    trip), as a Client."""
    path = os.path.join(folder, "echo.sock")
    echo = subprocess.Popen([sys.executable, "-c", ECHO_SERVER, path], stdout=subprocess.PIPE)
    echo.stdout.readline()
    try:
        with Client(path) as client:
            client.server_pid = echo.pid
            yield client
    finally:
        echo.kill()
        echo.wait()


HELLO_BLOCKS = 10


@contextlib.contextmanager
def pinned(server_pids: list[int], apart: bool):
    """This process on core 0 and every thread of the servers on core 0 too, or on core 1
    (`apart`). A round trip between two processes costs what waking the other one costs,
    and that depends on where the scheduler put them: on one core a wakeup is a switch, on
    two it is an interrupt to the other core (on a VM, through the hypervisor). Left to the
    scheduler, the same server measured 23 or 48 us a round trip from one round to the next;
    pinned, a daemon and its anchor are measured in the same placement."""
    import psutil
    threads = [t.id for pid in server_pids for t in psutil.Process(pid).threads()]
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {0})
    try:
        for tid in threads:
            os.sched_setaffinity(tid, {1} if apart else {0})
        yield
    finally:
        os.sched_setaffinity(0, before)
        for tid in threads:
            try:
                os.sched_setaffinity(tid, before)
            except OSError:
                pass  # that thread ended


def started_here() -> list[int]:
    """Every process this one started (daemons, their sandboxes' interpreters and file
    helpers, anchors' servers), for `pinned`, but the sandboxes' launchers and shims: a
    launcher whose affinity changed takes it for a command's tampering, and ends its session
    at its next fork (a shim, its next job). They are not on a round trip's path."""
    import psutil
    kept = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.name() not in ("bwrap", "toolsd-init", "toolsd-shim"):
                kept.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return kept


def on_one_core(fns, rounds: int, n: int, warmup: int) -> list[float] | None:
    """Medians of `fns`, taking turns over `rounds` rounds of `n` calls each (so that a drift
    of the machine meets them alike), with this process and those it started (started_here)
    on core 0: each wakeup is then a switch, not an interrupt to the other core (on a VM,
    through the hypervisor), and what is left is the CPU each takes. None on one core."""
    if len(os.sched_getaffinity(0)) < 2:
        return None
    times: list[list[float]] = [[] for _ in fns]
    with pinned(started_here(), apart=False):
        for _ in range(rounds):
            for fn, out in zip(fns, times):
                out += timed(fn, n, warmup)
    return [stats(t)[0] for t in times]


def bench_hello() -> None:
    n = 5000
    with running_daemon() as (sock, root, proc):
        with Client(sock) as c, trio_echo(root) as e:
            timed(c.hello, 200), timed(e.hello, 200)
            for apart in (False, True) if len(os.sched_getaffinity(0)) > 1 else (None,):
                # In alternating blocks, so that a drift of the machine meets both alike.
                with pinned([proc.pid, e.server_pid], apart) if apart is not None \
                        else contextlib.nullcontext():
                    hellos: list[float] = []
                    echoes: list[float] = []
                    for _ in range(HELLO_BLOCKS):
                        hellos += timed(c.hello, n // HELLO_BLOCKS, warmup=0)
                        echoes += timed(e.hello, n // HELLO_BLOCKS, warmup=0)
                (median, p90), (e_median, e_p90) = stats(hellos), stats(echoes)
                where = {None: "", False: ", client and server on one core",
                         True: ", client and server on two cores"}[apart]
                report(f"hello round trip{where}, median", us(median),
                       anchor=f"trio echo {us(e_median)}", ratio=median / e_median)
                report(f"hello round trip{where}, p90", us(p90),
                       anchor=f"trio echo {us(e_p90)}", ratio=p90 / e_p90)
            median = stats(timed(c.hello, n, warmup=200))[0]  # the scheduler's placement
            at_once = reads_at_once(c, os.path.join(root, "ws"), n=2000)
    for name, value in at_once.items():
        report(f"{name}, median", us(value), anchor=f"hello {us(median)}",
               ratio=value / median)
    with running_daemon() as (sock, root, _proc):
        flooded = hello_while_flooded(sock, n=2000)
    report("hello while another client pipelines hellos, median", us(flooded),
           anchor=f"unflooded {us(median)}", ratio=flooded / median)


def reads_at_once(c, workspace: str, n: int) -> dict[str, float]:
    """Medians of requests that need no task of their own (dispatch.py's `now`): a read of
    a process's output that waits for nothing (none new) and a listing of a session's ten
    finished processes."""
    os.makedirs(workspace)
    session = c.session_open(workspace)["session"]
    try:
        ids = [c.process_start(session, f"echo {i}")["id"] for i in range(10)]
        for bg in ids:
            c.process_output(bg, wait_s=30)
        c.session_close(session)  # with its sandbox, the processes' trees are gone for sure
        return {
            "process.output without wait, nothing new": stats(timed(
                lambda: c.process_output(ids[0]), n, warmup=100))[0],
            "process.list of 10 finished processes": stats(timed(
                lambda: c.process_list(session), n, warmup=100))[0],
        }
    finally:
        if session in {s["session"] for s in c.session_list()["sessions"]}:
            c.session_close(session)


FLOODER = r"""
import socket, struct, sys, msgspec
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
body = msgspec.msgpack.encode({"id": 1, "method": "hello", "params": {}})
batch = (struct.pack(">I", len(body)) + body) * 200
print("flooding", flush=True)
while True:
    s.sendall(batch)
    for _ in range(200):  # read the answers back, frame by frame
        (length,) = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))
        s.recv(length, socket.MSG_WAITALL)
"""


def hello_while_flooded(sock: str, n: int) -> float:
    """Median hello of one client while another process pipelines batches of 200 hellos
    without pause: what one greedy client costs everyone else."""
    flooder = subprocess.Popen([sys.executable, "-c", FLOODER, sock], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL)
    try:
        flooder.stdout.readline()
        with Client(sock) as c:
            return stats(timed(c.hello, n, warmup=100))[0]
    finally:
        flooder.kill()
        flooder.wait()


# ------------------------------------------------------------------ shell


def bwrap_per_call_argv() -> list[str]:
    """The flags a session uses, for one command: what a per-call sandbox would cost."""
    from toolsd.sandbox.bwrap import policy as sandbox
    scratch = tempfile.mkdtemp(prefix="toolsd-bench-scratch-")
    policy = sandbox.Policy(workspace=ROOT, scratch=scratch,
                            env=sandbox.sandbox_env(home=os.path.expanduser("~"),
                                                    path=os.environ["PATH"], lang="C.UTF-8",
                                                    extra={}))
    return sandbox.bwrap_argv(policy, bwrap=shutil.which("bwrap"))


def spawn_wait(argv: list[str]) -> None:
    pid = os.posix_spawn(argv[0], argv, {"PATH": os.environ["PATH"]})
    os.waitpid(pid, 0)


def open_sessions(c, workspace: str, pause_s: float,
                  n: int = 10) -> tuple[float, float, float]:
    """Medians over n sessions of (session.open, session.open + a first shell.run,
    session.close)."""
    readies, firsts, closes = [], [], []
    for _ in range(n):
        time.sleep(pause_s)
        t = time.perf_counter()
        s = c.session_open(workspace)["session"]
        readies.append(time.perf_counter() - t)
        c.shell_run(s, "true")
        firsts.append(time.perf_counter() - t)
        t = time.perf_counter()
        c.session_close(s)
        closes.append(time.perf_counter() - t)
    return statistics.median(readies), statistics.median(firsts), statistics.median(closes)


def bench_shell() -> None:
    import psutil

    n = 200
    bash = shutil.which("bash")
    with running_daemon() as (sock, root, proc):
        workspace = os.path.join(root, "ws")
        os.makedirs(workspace)
        with Client(sock) as c:
            # Sessions a second apart, as an agent opens them: each finds the warm spare
            # that the one before left (see Supervisor._make_spare).
            warm = open_sessions(c, workspace, pause_s=1.0)
            session = c.session_open(workspace)["session"]
            run_median, run_p90 = stats(timed(lambda: c.shell_run(session, "true"), n))
            plain = stats(timed(lambda: spawn_wait([bash, "-c", "true"]), n))[0]
            per_call = None
            if shutil.which("bwrap"):
                argv = bwrap_per_call_argv() + [bash, "-c", "true"]
                per_call = stats(timed(lambda: spawn_wait(argv), n // 2))[0]
            rss_before = psutil.Process(proc.pid).memory_info().rss
            size = 1_000_000_000
            t = time.perf_counter()
            r = c.shell_run(session, f"yes | head -c {size}", max_output_chars=1000,
                            timeout_s=600)
            drain = time.perf_counter() - t
            growth = psutil.Process(proc.pid).memory_info().rss - rss_before
            assert r["output_bytes"] == size
    with running_daemon("--no-warm-spare") as (sock, root, proc):
        workspace = os.path.join(root, "ws")
        os.makedirs(workspace)
        with Client(sock) as c:
            cold = open_sessions(c, workspace, pause_s=0)
    report("shell.run('true') through the daemon, median", ms(run_median),
           anchor=f"bwrap per call {ms(per_call)}" if per_call else "",
           ratio=run_median / per_call if per_call else None, target="<= 1.5 ms, <= 0.4 x")
    report("shell.run('true'), p90", ms(run_p90))
    report("plain bash -c true (posix_spawn + wait), median", ms(plain),
           anchor=f"shell.run {ms(run_median)}", ratio=run_median / plain)
    report("session.open, cold (sandbox ready for a command)", ms(cold[0]), target="< 50 ms")
    report("session.open, cold, + first shell.run('true')", ms(cold[1]))
    report("session.open taking the warm spare", ms(warm[0]),
           anchor=f"cold {ms(cold[0])}", ratio=warm[0] / cold[0])
    report("session.open, warm, + first shell.run('true')", ms(warm[1]))
    report("session.close after one shell.run, median", ms(warm[2]),
           anchor=f"session.open, cold {ms(cold[0])}", ratio=warm[2] / cold[0])
    report("drain rate of yes | head -c 1 GB", f"{size / drain / 1e6:8.0f} MB/s",
           target=">= 300 MB/s")
    report("daemon RSS growth during the flood", f"{growth / 1e6:8.1f} MB", target="< 32 MB")


def bench_spill_cwd() -> None:
    """What the 1.1 options cost: a flood kept whole in a file (spill) next to the same flood
    without it, and shell.run('true') reporting its folder next to without."""
    n = 200
    size = 256_000_000
    with running_daemon("--no-warm-spare") as (sock, root, proc):
        workspace = os.path.join(root, "ws")
        os.makedirs(workspace)
        with Client(sock) as c:
            session = c.session_open(workspace)["session"]
            plain = stats(timed(lambda: c.shell_run(session, "true"), n))[0]
            cwd = stats(timed(lambda: c.shell_run(session, "true", report_cwd=True), n))[0]
            drains = {}
            for spill in (False, True):
                t = time.perf_counter()
                r = c.shell_run(session, f"yes | head -c {size}", max_output_chars=1000,
                                timeout_s=600, spill=spill)
                drains[spill] = time.perf_counter() - t
                assert r["output_bytes"] == size and ("output_file" in r) == spill
            c.session_close(session)
    report("shell.run('true', report_cwd=True), median", ms(cwd), anchor=f"without {ms(plain)}",
           ratio=cwd / plain)
    report("drain rate of yes | head -c 256 MB, spill: true",
           f"{size / drains[True] / 1e6:8.0f} MB/s",
           anchor=f"without spill {size / drains[False] / 1e6:.0f} MB/s",
           ratio=drains[False] / drains[True])


# Command-line options, for the sections that take them (set by main).
OPTIONS: dict = {}


def section(module: str, function: str, *options: str):
    """A section kept in its own file (scripts/bench_*.py); those import this module's
    helpers, so they are imported when run, not at the top. `options` are the command-line
    options it takes, passed by name."""
    def run() -> None:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        getattr(__import__(module), function)(**{name: OPTIONS[name] for name in options})
    return run


SECTIONS = {
    "hello": bench_hello,
    "shell": bench_shell,
    "spill-cwd": bench_spill_cwd,
    "stream": section("bench_stream", "bench_stream"),
    "repl": section("bench_repl", "bench_repl"),
    "load-once": section("bench_repl", "bench_load_once"),
    "processes": section("bench_processes", "bench_processes"),
    "waiting": section("bench_waiting", "bench_waiting"),
    "launcher": section("bench_launcher", "bench_launcher"),
    "calls": section("bench_calls", "bench_calls"),
    "image": section("bench_image", "bench_image"),
    "load": section("bench_load", "bench_load", "sessions", "clients", "burst"),
    "home": section("bench_home", "bench_home"),
    "big-workspace": section("bench_home", "bench_big_workspace"),
    "ports": section("bench_ports", "bench_ports"),
    "remote": section("bench_remote", "bench_remote"),
    "egress": section("bench_egress", "bench_egress"),
    "files-cp": section("bench_files", "bench_cp"),
    "files-read": section("bench_files", "bench_read"),
    "cluster": section("bench_cluster", "bench_cluster"),
}


NUMBER = re.compile(r"^(.*?)\s*(-?\d+(?:\.\d+)?)\s*(\S*)$")


def spread(texts: list[str]) -> str:
    """'label lo-hi unit' over the rounds' texts of one figure or anchor, read back from the
    text report() was given (the same label and unit in every round)."""
    parsed = [NUMBER.match(t.strip()) for t in texts if t]
    if not parsed or not all(parsed):
        return " | ".join(t.strip() for t in texts if t)
    label, unit = parsed[0].group(1), parsed[0].group(3)
    values = [float(m.group(2)) for m in parsed]
    return f"{label} {min(values):g}-{max(values):g} {unit}".strip()


def print_side_by_side(trees: list[str]) -> None:
    for name, by_tree in FIGURES.items():
        print(name + ("   [no daemon: this checkout's code in every column]"
                      if name in IN_PROCESS else ""))
        for i, tree in enumerate(trees):
            rounds = by_tree.get(tree, [])
            line = f"  {chr(65 + i)} {spread([v for v, _, _ in rounds]):<24}"
            if any(a for _, a, _ in rounds):
                line += f"  anchor {spread([a for _, a, _ in rounds])}"
            ratios = [r for _, _, r in rounds if r is not None]
            if ratios:
                line += f"  ratio {min(ratios):.2f}-{max(ratios):.2f}"
            print(f"{line}  ({len(rounds)} rounds)", flush=True)


def run_trees(trees: list[str], rounds: int, names: list[str]) -> None:
    global TREE, FIGURES, SECTION_DAEMONS
    for i, tree in enumerate(trees):
        if not os.path.isfile(os.path.join(tree, "toolsd", "__main__.py")):
            raise SystemExit(f"--tree {tree}: no toolsd/__main__.py there; give a checkout")
        print(f"{chr(65 + i)} = {tree}")
    FIGURES = {}
    for r in range(rounds):
        for tree in trees:
            print(f"round {r + 1}/{rounds}: {tree}", flush=True)
            TREE = tree
            for name in names:
                SECTION_DAEMONS = 0
                SECTIONS[name]()
    TREE = None
    print_side_by_side(trees)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description="toolsd's speed, next to anchors")
    parser.add_argument("sections", nargs="*", metavar="section",
                        help=f"any of {', '.join(SECTIONS)} (default: all)")
    parser.add_argument("--sessions", type=int, default=200,
                        help="sessions the load section opens (default 200)")
    parser.add_argument("--clients", type=int, default=16,
                        help="concurrent clients of the load section (default 16)")
    parser.add_argument("--no-burst", dest="burst", action="store_false",
                        help="load: no REPL in the sessions beyond the first 50, so no burst "
                             "of REPL starts and no repl.exec over all N (much shorter)")
    parser.add_argument("--tree", action="append", default=[], metavar="PATH",
                        help="a checkout whose daemon to measure (repeat to compare trees)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="with --tree: rounds over the trees (default 3)")
    args = parser.parse_args(argv)
    names = args.sections or list(SECTIONS)
    for name in names:
        if name not in SECTIONS:
            raise SystemExit(f"unknown section {name!r}; known: {', '.join(SECTIONS)}")
    print(f"toolsd bench on {os.cpu_count()} cores, python {sys.version.split()[0]}")
    OPTIONS.update(sessions=args.sessions, clients=args.clients, burst=args.burst)
    if args.tree:
        run_trees([os.path.abspath(t) for t in args.tree], args.rounds, names)
        return
    for name in names:
        SECTIONS[name]()


if __name__ == "__main__":
    # The sections' `from bench import report, running_daemon` must find this module, with
    # its TREE and FIGURES, not a second copy of the file.
    sys.modules.setdefault("bench", sys.modules[__name__])
    main(sys.argv[1:])
