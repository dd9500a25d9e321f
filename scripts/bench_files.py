#!/usr/bin/env python3
"""Files (protocol 1.2 "files"): `toolsd cp` of a 20,000-file tree into a session and back,
next to `tar | tar` of the same tree on the same disk (same run; goal: within 2x); and a 1 GiB
file read in 8 MiB parts through file.read, next to `cat` of it inside the session.

Run: .venv/bin/python scripts/bench_files.py [cp|read]   (scripts/bench.py runs them as the
sections `files-cp` and `files-read`)
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench import report, running_daemon  # noqa: E402

from toolsd.client import Client  # noqa: E402

FILES = 20_000
GiB = 1 << 30


def make_tree(root: str) -> int:
    """A source tree's shape: 20,000 small files (0 to 4 KiB) in 360 folders. Its bytes."""
    generator = random.Random(20000)
    total = 0
    for i in range(FILES):
        folder = os.path.join(root, f"pkg{i % 40}", f"mod{i % 9}")
        os.makedirs(folder, exist_ok=True)
        data = generator.randbytes(generator.randrange(0, 4096))
        total += len(data)
        with open(os.path.join(folder, f"file{i}.py"), "wb") as f:
            f.write(data)
    return total


def _run(argv, **options) -> float:
    t = time.perf_counter()
    subprocess.run(argv, check=True, **options)
    return time.perf_counter() - t


ROUNDS = 2  # of tar | tar, cp in, cp out, alternating: the disk's speed drifts (journal
# commits, discards, other processes' I/O), so each gets the best of its rounds


def bench_cp() -> None:
    with running_daemon("--no-warm-spare") as (sock, root, _proc):
        workspace = os.path.join(root, "ws")
        source = os.path.join(root, "src")
        os.makedirs(workspace)
        size = make_tree(source)
        env = {**os.environ, "TOOLSD_SOCKET": sock}
        cp = [sys.executable, "-m", "toolsd", "cp", "--quiet"]
        best = {"tar": float("inf"), "up": float("inf"), "down": float("inf")}
        with Client(sock) as c:
            session = c.session_open(workspace)["session"]
            c.file_stat(session, ".")  # its file helper runs
            for n in range(ROUNDS):
                subprocess.run(["sync"], check=True)
                tar_dest = os.path.join(root, f"tarred{n}")
                os.makedirs(tar_dest)
                best["tar"] = min(best["tar"], _run(
                    f"tar -C {source} -cf - . | tar -C {tar_dest} -xf -", shell=True))
                subprocess.run(["sync"], check=True)
                best["up"] = min(best["up"], _run([*cp, source, f"{session}:copy{n}"], env=env))
                subprocess.run(["sync"], check=True)
                best["down"] = min(best["down"], _run(
                    [*cp, f"{session}:copy{n}", os.path.join(root, f"back{n}")], env=env))
            c.session_close(session)
    tar, up, down = best["tar"], best["up"], best["down"]
    mb = size / 1e6
    report(f"toolsd cp of {FILES} files ({mb:.0f} MB) into a session",
           f"{FILES / up:8.0f} files/s",
           anchor=f"tar | tar {FILES / tar:.0f} files/s", ratio=up / tar, target="< 2")
    report(f"toolsd cp of {FILES} files out of a session", f"{FILES / down:8.0f} files/s",
           anchor=f"tar | tar {FILES / tar:.0f} files/s", ratio=down / tar, target="< 2")


def bench_read() -> None:
    with running_daemon("--no-warm-spare") as (sock, root, _proc):
        workspace = os.path.join(root, "ws")
        os.makedirs(workspace)
        path = os.path.join(workspace, "big.bin")
        with open(path, "wb") as f:
            block = os.urandom(8 << 20)
            for _ in range(GiB // len(block)):
                f.write(block)
        with Client(sock) as c:
            session = c.session_open(workspace)["session"]
            c.file_stat(session, "big.bin")
            best_read, best_cat = float("inf"), float("inf")
            for _ in range(3):
                t = time.perf_counter()
                r = c.shell_run(session, "cat big.bin > /dev/null", timeout_s=600)
                best_cat = min(best_cat, time.perf_counter() - t)
                assert r["exit_code"] == 0, r["output"]
                t = time.perf_counter()
                offset = 0
                while True:
                    part = c.file_read(session, "big.bin", offset=offset)
                    offset += len(part["data"])
                    if part["eof"]:
                        break
                best_read = min(best_read, time.perf_counter() - t)
                assert offset == GiB
            c.session_close(session)
    report("file.read of 1 GiB in 8 MiB parts (page cache)",
           f"{GiB / best_read / 1e6:8.0f} MB/s",
           anchor=f"cat in the session {GiB / best_cat / 1e6:.0f} MB/s",
           ratio=best_read / best_cat)


if __name__ == "__main__":
    which = sys.argv[1:] or ["cp", "read"]
    for name in which:
        {"cp": bench_cp, "read": bench_read}[name]()
