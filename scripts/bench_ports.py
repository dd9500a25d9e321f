#!/usr/bin/env python3
"""What a forwarded port costs: a download from `python3 -m http.server` in a session through
port.forward, next to the same download from the same server program run on the host and
fetched over loopback directly, in the same run; and the cost of a new connection (a small
fetch) both ways, which for a forward includes the launcher's connect inside the sandbox.

Run: .venv/bin/python scripts/bench_ports.py   (scripts/bench.py runs it as section `ports`)
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench import ms, report, running_daemon, stats, timed  # noqa: E402

from toolsd.client import Client  # noqa: E402

SIZE = 256 << 20
ROUNDS = 5
SMALL_FETCHES = 200
PORT_INSIDE = 8000


def get(port: int, path: str) -> int:
    """Bytes of one HTTP/1.0 GET of `path` from 127.0.0.1:port, body and headers."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(f"GET /{path} HTTP/1.0\r\n\r\n".encode())
        buf = bytearray(1 << 20)
        total = 0
        while n := s.recv_into(buf):
            total += n
        return total


def rate(port: int) -> float:
    """The best of ROUNDS downloads of the big file, in MB/s."""
    best = min(timed(lambda: get(port, "big"), ROUNDS, warmup=1))
    return SIZE / best / 1e6


@contextlib.contextmanager
def host_server(folder: str):
    """The same server program on the host, on a free loopback port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-u", "-m", "http.server", str(port), "--bind",
                             "127.0.0.1"], cwd=folder, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    try:
        proc.stdout.readline()  # "Serving HTTP on ...": it listens
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def bench_ports() -> None:
    with running_daemon("--no-warm-spare") as (sock, root, _proc):
        workspace = os.path.join(root, "ws")
        os.makedirs(workspace)
        with open(os.path.join(workspace, "big"), "wb") as f:
            f.truncate(SIZE)  # sparse: the page cache serves it alike both ways
        with open(os.path.join(workspace, "small"), "wb") as f:
            f.write(b"x" * 100)
        with Client(sock) as c:
            session = c.session_open(workspace, network="none")["session"]
            bg = c.process_start(session, f"python3 -m http.server {PORT_INSIDE} "
                                          f"--bind 127.0.0.1")["id"]
            if "Serving" not in c.process_output(bg, wait_s=60, until="Serving")["output"]:
                raise SystemExit("http.server did not start in the session")
            forwarded = c.port_forward(session, PORT_INSIDE)["port"]
            with host_server(workspace) as direct:
                assert get(forwarded, "big") == get(direct, "big") > SIZE
                rates = {}
                small = {}
                for _ in range(2):  # interleaved, so the machine's load falls alike
                    for name, port in (("forwarded", forwarded), ("direct", direct)):
                        rates.setdefault(name, []).append(rate(port))
                        small.setdefault(name, []).extend(
                            timed(lambda port=port: get(port, "small"), SMALL_FETCHES // 2))
            c.process_stop(bg)
            c.session_close(session)
    fwd, dir_ = max(rates["forwarded"]), max(rates["direct"])
    report("download of 256 MB through port.forward", f"{fwd:8.0f} MB/s",
           anchor=f"direct loopback {dir_:.0f} MB/s", ratio=dir_ / fwd)
    fs, ds = stats(small["forwarded"])[0], stats(small["direct"])[0]
    report("new connection + 100 B fetch, port.forward, median", ms(fs),
           anchor=f"direct loopback {ms(ds)}", ratio=fs / ds)


if __name__ == "__main__":
    print(f"toolsd bench on {os.cpu_count()} cores, python {sys.version.split()[0]}")
    bench_ports()
