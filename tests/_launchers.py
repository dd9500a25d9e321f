"""What the tests that drive a Launcher directly share: the bwrap argv of a bare sandbox, a clean
environment, and spawning with output on a pipe."""

from __future__ import annotations

import os
import shutil
import sys

import psutil
import trio

from toolsd.sandbox.launcher import Launcher
from toolsd.sandbox.session_policy import own_files_under_tmp

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


async def spawn_piped(launcher, argv, *, cwd="/", env=ENV, stdin=None, **kw):
    """Spawn with stdout+stderr on one pipe; returns (job, read_fd)."""
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        job = await launcher.spawn(argv, cwd=cwd, env=env,
                                   stdin=devnull if stdin is None else stdin,
                                   stdout=write_fd, stderr=write_fd, **kw)
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
        os.close(devnull)
    return job, read_fd
