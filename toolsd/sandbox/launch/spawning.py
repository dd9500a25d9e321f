"""Spawning in a sandbox, the library every tool uses: spawn with a pipe or a terminal, a
shell command of any size, pump a pipe into a sink, end a job's whole tree. What spawns is
a Spawner: the session's Sandbox (session_sandbox.py), or a bare Launcher in its tests.
"""

from __future__ import annotations

import os
import signal as signal_module
from collections.abc import Mapping
from typing import Protocol

import trio

from toolsd.runtime import threads
from toolsd.runtime.child_fds import ChildFds
from toolsd.runtime.fdio import READ_SIZE, FdReader
from toolsd.sandbox.launch import proctree
from toolsd.sandbox.errors import Fault, SandboxError
from toolsd.sandbox.launch.job import Job
from toolsd.sandbox.launch.launcher_client import KILL_THREADS
from toolsd.sandbox.launch.spawn_request import SpawnRequest
from toolsd.sandbox.launch.shell_argv import shell_argv

# After its tree is killed, how long a job's shim has to report the exit before it is killed
# too (a shim stopped by its own command never would).
SHIM_REPORT_S = 1.0


def signal_name(number: int | None) -> str | None:
    if number is None:
        return None
    try:
        return signal_module.Signals(number).name
    except ValueError:
        return f"SIG{number}"


async def pump(fd: int, sink, room=None) -> None:
    """Read `fd` into `sink(bytes)` until EOF (read_into). Closes the fd."""
    os.set_blocking(fd, False)
    try:
        await read_into(FdReader(fd, wait_after_short=True), sink, room)
    finally:
        trio.lowlevel.notify_closing(fd)
        os.close(fd)


async def read_into(reader: FdReader, sink, room=None) -> None:
    """Read `reader` into `sink(bytes)` until EOF (a read error ends it as EOF does). `room()`,
    if given, is awaited after each sink: a sink that cannot take more for now holds the
    writer in its pipe. Cancelled, it has lost nothing: what it read is in the sink."""
    while True:
        try:
            data = await reader.read(READ_SIZE)
        except OSError:
            return
        if not data:
            return
        sink(data)
        if room is not None:
            await room()


def open_devnull() -> int:
    return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)


class Spawner(Protocol):
    """What runs a SpawnRequest: a session's Sandbox (its errors are SandboxErrors), or a
    bare Launcher, as the launcher's own tests use (LauncherErrors). `devnull`: a read-only
    /dev/null of the spawner's, to pass as a command's stdin (it stays the spawner's)."""

    devnull: int

    async def spawn(self, request: SpawnRequest) -> Job: ...


async def spawn_with_pipe(spawner: Spawner, argv: list[str], *, cwd: str,
                          env: Mapping[str, str], extra_fds=(), want_pid: bool = True,
                          held: bool = False, stdin: int | None = None,
                          tty: tuple[int, int] | None = None,
                          rlimits: Mapping[str, tuple[int, int]] | None = None,
                          resume_stopped: bool = False):
    """Spawn `argv` with stdin /dev/null (the spawner's), or the fd `stdin` (which stays the
    caller's), and stdout+stderr one pipe. Returns (job, read_fd); the caller owns read_fd.
    With `tty` (cols, rows) fds 0-2 are a new terminal instead, and read_fd is its master
    side, which the process's input is written to as well. `rlimits` None: the spawner's
    own; `resume_stopped` as SpawnRequest's."""
    if tty is not None:
        return await spawn_with_terminal(spawner, argv, cwd=cwd, env=env, tty=tty,
                                         extra_fds=extra_fds, want_pid=want_pid, held=held)
    with ChildFds() as fds:  # also cancelled: the client went away mid-spawn
        read_fd, write_fd = fds.pipe()
        if stdin is None:
            stdin = spawner.devnull
        job = await spawner.spawn(SpawnRequest(
            argv, cwd, env, stdin=stdin, stdout=write_fd, stderr=write_fd,
            extra_fds=tuple(extra_fds), want_pid=want_pid, held=held, rlimits=rlimits,
            resume_stopped=resume_stopped))
    return job, read_fd


async def spawn_with_terminal(spawner: Spawner, argv: list[str], *, cwd: str,
                              env: Mapping[str, str], tty: tuple[int, int], extra_fds=(),
                              want_pid: bool = True, held: bool = False):
    """spawn_with_pipe's `tty` case: (job, the terminal's master side, the caller's)."""
    devnull = spawner.devnull
    job = await spawner.spawn(SpawnRequest(
        argv, cwd, env, stdin=devnull, stdout=devnull, stderr=devnull,
        extra_fds=tuple(extra_fds), want_pid=want_pid, held=held, tty=tty))
    master, job.terminal_fd = job.terminal_fd, -1
    if master == -1:  # the launcher never sends a `started` without it for a tty request
        raise SandboxError(Fault.REFUSED, f"could not start {argv[0]} on a terminal: the "
                           f"sandbox launcher gave none back; start it without tty")
    return job, master


async def spawn_shell(spawner: Spawner, shell_path: str, command: str, *, cwd: str,
                      env: Mapping[str, str], extra_fds=(), want_pid: bool = True,
                      held: bool = False, **options):
    """spawn_with_pipe for `command` run by the shell at `shell_path`, however big it is
    (see shell_argv): `extra_fds` are the shell's fds 3, 4, ... as for spawn_with_pipe; a
    big command's own comes after them; `options` are spawn_with_pipe's `stdin` and `tty`.
    Returns (job, read_fd)."""
    script_fd = 3 + len(extra_fds)
    try:
        argv, script = shell_argv(shell_path, command, script_fd)
    except ValueError as e:
        raise SandboxError(Fault.REFUSED, str(e)) from None
    if script is None:
        return await spawn_with_pipe(spawner, argv, cwd=cwd, env=env, extra_fds=extra_fds,
                                     want_pid=want_pid, held=held, **options)
    with ChildFds() as fds:  # the shell has its own copy, and closes it before the command
        script_file = fds.child(memory_file(script))
        return await spawn_with_pipe(spawner, argv, cwd=cwd, env=env,
                                     extra_fds=[*extra_fds, script_file], want_pid=want_pid,
                                     held=held, **options)


def memory_file(data: bytes) -> int:
    """A memfd holding `data`, at offset 0."""
    with ChildFds() as fds:
        fd = fds.ours(os.memfd_create("toolsd-command", os.MFD_CLOEXEC))
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
    return fd


async def kill_tree(root_pid: int, grace_s: float) -> tuple[int, int]:
    """proctree.kill_tree in a worker thread of its own pool: a stop holds its thread for the
    whole grace period, and must not starve the threads everything else uses."""
    return await trio.to_thread.run_sync(
        lambda: proctree.kill_tree(root_pid, grace_s=grace_s, include_root=False),
        limiter=threads.limiter("kill", KILL_THREADS))


async def end_tree(job, grace_s: float) -> tuple[int, int]:
    """End the command's whole tree through its shim (every orphan of the tree reparents to
    it) and wait for the exit to be reported; (processes ended, survivors)."""
    ended = survivors = 0
    with job.holding_tree() as shim_pid:
        if shim_pid is not None:
            ended, survivors = await kill_tree(shim_pid, grace_s)
    if not job.exited.is_set():
        with trio.move_on_after(SHIM_REPORT_S):
            await job.exited.wait()
    if not job.exited.is_set():
        # The shim does not report (stopped by the command, kill -STOP $PPID, and not
        # resumed: the launcher resumes its shims, unless it is stopped itself, which only
        # an unsandboxed session can do). Killed, it makes the launcher end what is left of
        # the job and report it.
        with job.holding_tree() as shim_pid:
            if shim_pid is not None:
                try:
                    os.kill(shim_pid, signal_module.SIGKILL)
                except ProcessLookupError:
                    pass
        with trio.move_on_after(5):
            await job.exited.wait()
    return ended, survivors
