"""What the tests that drive a Launcher directly share: the bwrap argv of a bare sandbox, a clean
environment, and spawning with output on a pipe."""

from __future__ import annotations

import os
import shutil
import sys

import psutil
import trio

from toolsd.sandbox.launch.spawning import spawn_with_pipe
from toolsd.sandbox.launch.launcher_client import Launcher
from toolsd.sandbox.bwrap.session_policy import own_files_under_tmp

BWRAP = shutil.which("bwrap")
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
PY = sys.executable


def bwrap_prefix(folder: str) -> list[str]:
    # A checkout under /tmp needs its own files bound back over the sandbox's private /tmp.
    own = [a for p in own_files_under_tmp() for a in ("--ro-bind", p, p)]
    return [BWRAP, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
            *own, "--bind", folder, folder, "--unshare-user", "--unshare-pid", "--unshare-ipc",
            "--unshare-uts", "--unshare-net", "--as-pid-1", "--die-with-parent",
            "--new-session", "--cap-drop", "ALL", "--"]


def tree_pids(launcher: Launcher) -> set[int]:
    pids = {launcher.wrapper_pid, launcher.host_pid}
    try:
        pids.update(p.pid for p in psutil.Process(launcher.wrapper_pid).children(recursive=True))
    except psutil.NoSuchProcess:
        pass
    return pids


async def read_all(fd: int) -> bytes:
    chunks = []
    async with trio.lowlevel.FdStream(fd) as stream:
        while data := await stream.receive_some():
            chunks.append(data)
    return b"".join(chunks)


async def spawn_piped(launcher, argv, *, cwd="/", env=ENV, **options):
    """Spawn with stdout+stderr on one pipe (jobs.spawn_with_pipe on the bare launcher);
    returns (job, read_fd)."""
    return await spawn_with_pipe(launcher, argv, cwd=cwd, env=env, **options)
