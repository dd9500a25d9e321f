#!/usr/bin/env python3
"""TCP with TLS and tokens (protocol 1.2): round trips, connects and bulk output over TLS next
to the same over the Unix socket, on one daemon in the same run; and what strangers that
never authenticate cost the daemon.

Run: .venv/bin/python scripts/bench_remote.py   (scripts/bench.py runs it as the section
`remote`)
"""

from __future__ import annotations

import os
import resource
import socket
import ssl
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench import ms, report, running_daemon, stats, timed, us  # noqa: E402

from toolsd.client import Client  # noqa: E402

STREAM_SIZE = 64_000_000
STRANGERS = 1000


def tls_of(proc, state_dir: str) -> tuple[str, str, str]:
    """The URL and fingerprint the daemon printed, and the default token."""
    while True:
        line = proc.stdout.readline().decode()
        if "tls://" in line:
            words = line.split()
            url = next(w for w in words if w.startswith("tls://"))
            fingerprint = next(w for w in words if w.startswith("sha256:")).rstrip(";")
            with open(os.path.join(state_dir, "token")) as f:
                return url, fingerprint, f.read().split()[1]
        if not line:
            raise SystemExit("the daemon printed no TLS listener")


def drain(c: Client, session: str) -> float:
    """Seconds to stream STREAM_SIZE bytes of output (1.1 "stream")."""
    got = [0]

    def count(event) -> None:
        got[0] += len(event.data)

    t = time.perf_counter()
    c.shell_run(session, f"yes | head -c {STREAM_SIZE}", max_output_chars=1000,
                timeout_s=600, on_event=count)
    elapsed = time.perf_counter() - t
    assert got[0] == STREAM_SIZE
    return elapsed


def strangers_cost(url: str, pid: int) -> tuple[float, float]:
    """KiB of daemon RSS per silent TCP connection and per connection that finished the TLS
    handshake and said nothing more."""
    import psutil

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    host, _, port = url.removeprefix("tls://").rpartition(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    daemon = psutil.Process(pid)
    costs = []
    socks = []
    try:
        for handshake in (False, True):
            fds, rss = daemon.num_fds(), daemon.memory_info().rss
            for _ in range(STRANGERS):
                sock = socket.create_connection((host, int(port)))
                socks.append(context.wrap_socket(sock) if handshake else sock)
            deadline = time.monotonic() + 30
            while daemon.num_fds() < fds + STRANGERS * 0.99 and time.monotonic() < deadline:
                time.sleep(0.05)
            costs.append((daemon.memory_info().rss - rss) / 1024 / STRANGERS)
    finally:
        for sock in socks:
            sock.close()
    return costs[0], costs[1]


def bench_remote() -> None:
    n = 3000
    with running_daemon("--no-warm-spare", "--listen", "tls://127.0.0.1:0") as (
            sock, root, proc):
        url, fingerprint, token = tls_of(proc, os.path.join(root, "state"))
        workspace = os.path.join(root, "ws")
        os.makedirs(workspace)
        with Client(sock) as local, Client(url, token=token, fingerprint=fingerprint) as far:
            session = far.session_open(workspace)["session"]  # the local owner sees it too
            figures = {}
            for name, c in (("unix", local), ("tls", far)):
                figures[name, "hello"] = stats(timed(c.hello, n, warmup=200))
                figures[name, "shell"] = stats(timed(
                    lambda c=c: c.shell_run(session, "true"), 300, warmup=20))[0]
            connect = {
                "unix": stats(timed(lambda: Client(sock).close(), 200))[0],
                "tls": stats(timed(lambda: Client(url, token=token,
                                                  fingerprint=fingerprint).close(), 200))[0]}
            streamed = {name: min(drain(c, session) for _ in range(2))
                        for name, c in (("unix", local), ("tls", far))}
            local.session_close(session)
        silent, handshaken = strangers_cost(url, proc.pid)
    for which, label in ((0, "median"), (1, "p90")):
        tls, unix = figures["tls", "hello"][which], figures["unix", "hello"][which]
        report(f"hello round trip over TLS, {label}", us(tls), anchor=f"Unix socket {us(unix)}",
               ratio=tls / unix)
    report("shell.run('true') over TLS, median", ms(figures["tls", "shell"]),
           anchor=f"Unix socket {ms(figures['unix', 'shell'])}",
           ratio=figures["tls", "shell"] / figures["unix", "shell"])
    report("connect (+ TLS handshake and token) and close", ms(connect["tls"]),
           anchor=f"Unix socket {ms(connect['unix'])}", ratio=connect["tls"] / connect["unix"])
    rate = {k: STREAM_SIZE / v / 1e6 for k, v in streamed.items()}
    report("streamed output of yes | head -c 64 MB over TLS", f"{rate['tls']:8.0f} MB/s",
           anchor=f"Unix socket {rate['unix']:.0f} MB/s", ratio=rate["unix"] / rate["tls"])
    report(f"daemon RSS per silent TCP stranger ({STRANGERS})", f"{silent:8.1f} KiB")
    report(f"daemon RSS per stranger after its TLS handshake ({STRANGERS})",
           f"{handshaken:8.1f} KiB")


if __name__ == "__main__":
    bench_remote()
