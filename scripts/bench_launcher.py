#!/usr/bin/env python3
"""The launcher on its own, without a daemon: spawn-to-exit of `bash -c true` through a
launcher, unsandboxed and in a session's bwrap, next to subprocess.run and a bwrap per command.

Run: .venv/bin/python scripts/bench_launcher.py   (scripts/bench.py runs it as a section)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import trio

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench import bwrap_per_call_argv, ms, report, stats  # noqa: E402

from toolsd.sandbox.launch.launcher_client import Launcher  # noqa: E402
from toolsd.sandbox.launch.spawn_request import SpawnRequest  # noqa: E402

ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
SPAWNS = 50


async def launcher_spawns(wrapper: list[str], n: int) -> list[float]:
    """Seconds from spawn to exit of `bash -c true` through one launcher, n times."""
    async with trio.open_nursery() as nursery:
        launcher = await Launcher.start(nursery, wrapper=wrapper, env=ENV)
        try:
            samples = []
            for _ in range(n):
                t = time.perf_counter()
                job = await launcher.spawn(SpawnRequest(["bash", "-c", "true"], cwd="/",
                                                        env=ENV, stdin=0, stdout=1, stderr=2))
                if await job.wait() != (0, None):
                    raise SystemExit("bash -c true failed in the launcher")
                samples.append(time.perf_counter() - t)
            return samples
        finally:
            await launcher.aclose()


def runs(argv: list[str], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(argv, check=True)
        samples.append(time.perf_counter() - t)
    return samples


def bench_launcher() -> None:
    plain = stats(runs(["bash", "-c", "true"], SPAWNS))[0]
    unsandboxed = stats(trio.run(launcher_spawns, [], SPAWNS))[0]
    report("launcher spawn-to-exit of bash -c true, unsandboxed, median", ms(unsandboxed),
           anchor=f"subprocess.run {ms(plain)}", ratio=unsandboxed / plain)
    if shutil.which("bwrap") is None:
        print("  (no bwrap: the sandboxed figures are left out)")
        return
    wrapper = bwrap_per_call_argv()
    per_command = stats(runs([*wrapper, "bash", "-c", "true"], SPAWNS // 2))[0]
    sandboxed = stats(trio.run(launcher_spawns, wrapper, SPAWNS))[0]
    report("launcher spawn-to-exit of bash -c true, in bwrap, median", ms(sandboxed),
           anchor=f"bwrap per command {ms(per_command)}", ratio=sandboxed / per_command)


if __name__ == "__main__":
    print(f"toolsd bench on {os.cpu_count()} cores, python {sys.version.split()[0]}")
    bench_launcher()
