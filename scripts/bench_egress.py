#!/usr/bin/env python3
"""Egress by domain (protocol 1.2 "egress"): a 200 MB download from a loopback server through
the session's proxy (plain HTTP, and a CONNECT tunnel), next to the same download in a
session with network "host", and through a bare relay (threads splicing bytes, no checks, no
toolsd: what any proxy's extra hop costs on this machine), measured in the same run; and the
daemon's memory meanwhile.

Run: .venv/bin/python scripts/bench_egress.py   (scripts/bench.py runs it as the section
`egress`)
"""

from __future__ import annotations

import http.server
import os
import socket
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench import report, running_daemon  # noqa: E402

from toolsd.client import Client  # noqa: E402

SIZE = 200 * 1024 * 1024
CHUNK = b"\0" * (1 << 20)
RUNS = 7  # each way, alternating; the best of each is reported
ORIGIN = "127.0.0.2"  # not in the sandbox's NO_PROXY, as 127.0.0.1 is


class Zeros(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(SIZE))
        self.send_header("Connection", "close")
        self.end_headers()
        for _ in range(SIZE // len(CHUNK)):
            self.wfile.write(CHUNK)


def bare_relay(port: int) -> int:
    """A relay on 127.0.0.3 to ORIGIN:port, two threads splicing per connection; its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.3", 0))
    listener.listen(16)

    def pump(a, b):
        r, w = os.pipe()
        try:
            while n := os.splice(a.fileno(), w, 1 << 20):
                while n:
                    n -= os.splice(r, b.fileno(), n)
            b.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        finally:
            os.close(r)
            os.close(w)

    def serve():
        while True:
            conn, _ = listener.accept()
            upstream = socket.create_connection((ORIGIN, port))
            threading.Thread(target=pump, args=(conn, upstream), daemon=True).start()
            threading.Thread(target=pump, args=(upstream, conn), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1]


def bench_egress() -> None:
    import psutil

    server = http.server.ThreadingHTTPServer((ORIGIN, 0), Zeros)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    url = f"http://{ORIGIN}:{port}/zeros"
    get = f"curl -sS -o /dev/null -w '%{{size_download}}' {url}"
    relay = get.replace(f"{ORIGIN}:{port}", f"127.0.0.3:{bare_relay(port)}")
    ways = {"host": get, "relay": relay, "proxy": get, "tunnel": get + " --proxytunnel"}
    try:
        with running_daemon("--no-warm-spare") as (sock, root, proc):
            daemon = psutil.Process(proc.pid)
            with Client(sock) as c:
                sessions = {}
                for way in ways:
                    workspace = os.path.join(root, f"ws-{way}")
                    os.makedirs(workspace)
                    network = "host" if way in ("host", "relay") else {
                        "allow": [f"{ORIGIN}/32"], "ports": [port]}
                    sessions[way] = c.session_open(workspace, network=network)["session"]
                    c.shell_run(sessions[way], "true")
                rss_before = daemon.memory_info().rss
                best = {way: float("inf") for way in ways}
                for _ in range(RUNS):
                    for way, command in ways.items():
                        t = time.perf_counter()
                        r = c.shell_run(sessions[way], command, timeout_s=600)
                        best[way] = min(best[way], time.perf_counter() - t)
                        assert r["output"].strip() == str(SIZE), (way, r["output"])
                growth = daemon.memory_info().rss - rss_before
                for session in sessions.values():
                    c.session_close(session)
    finally:
        server.shutdown()
        server.server_close()
    rate = {way: SIZE / best[way] / 1e6 for way in ways}
    for way, what in (("proxy", "HTTP proxy"), ("tunnel", "CONNECT tunnel")):
        report(f"200 MB download through the {what}", f"{rate[way]:8.0f} MB/s",
               anchor=f'network "host" {rate["host"]:.0f} MB/s',
               ratio=best[way] / best["host"], target="time ratio <= 1.3")
        report(f"  the same, next to a bare relay's hop", f"{rate[way]:8.0f} MB/s",
               anchor=f"bare relay {rate['relay']:.0f} MB/s", ratio=best[way] / best["relay"])
    report("daemon RSS growth over the downloads", f"{growth / 1e6:8.1f} MB",
           target="< 32 MB")


if __name__ == "__main__":
    bench_egress()
