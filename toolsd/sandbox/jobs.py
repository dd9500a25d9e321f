"""Spawning through a session's launcher, the library every tool uses: spawn with a pipe,
pump a pipe into a sink, end a job's whole tree, the spawn timeout.

`session` here is the daemon's Session: its launcher, rlimits and limits, and the
`repositories.known` event that every spawn waits for.
"""

from __future__ import annotations

import os
import signal as signal_module

import trio

from toolsd.runtime import threads
from toolsd.runtime.fdio import READ_SIZE, FdReader
from toolsd.sandbox import proctree
from toolsd.sandbox.errors import Fault, SandboxError
from toolsd.sandbox.launcher import KILL_THREADS, LauncherDied, LauncherError, LauncherLimit
from toolsd.sandbox.shell_argv import shell_argv

# A spawn that takes longer than this means the session's launcher is stuck (sandboxed, pid 1
# of its namespace, its code cannot stop it; unsandboxed it can).
SPAWN_TIMEOUT_S = 10.0
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
    """Read `fd` into `sink(bytes)` until EOF. Closes the fd. `room()`, if given, is awaited
    after each sink: a sink that cannot take more for now holds the writer in its pipe."""
    os.set_blocking(fd, False)
    reader = FdReader(fd, wait_after_short=True)
    try:
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
    finally:
        trio.lowlevel.notify_closing(fd)
        os.close(fd)


def open_devnull() -> int:
    return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)


async def spawn(session, argv: list[str], *, cwd: str, env: dict[str, str], stdin: int,
                stdout: int, stderr: int, extra_fds=(), want_pid: bool = True,
                held: bool = False, what: str | None = None,
                fault: Fault = Fault.REFUSED, tty: tuple[int, int] | None = None):
    """Start `argv` in the session's sandbox (Launcher.spawn: the fds stay the caller's) and
    return its Job: the one way every tool starts a command. A launcher that does not answer
    within SPAWN_TIMEOUT_S is stuck, and ends the sandbox. The launcher's errors become the
    SandboxError a caller sees: the session closed, its process limit, or `fault` with
    "could not start `what`" (argv[0] by default)."""
    if not session.repositories.known.is_set():
        # A session opened on a big workspace is handed out while its repositories are
        # still being looked at: a command now could change what counts as found at open.
        await session.repositories.known.wait()
    try:
        with trio.move_on_after(SPAWN_TIMEOUT_S) as waited:
            job = await session.launcher.spawn(
                argv, cwd=cwd, env=env, stdin=stdin, stdout=stdout, stderr=stderr,
                rlimits=session.rlimits, extra_fds=extra_fds, want_pid=want_pid, held=held,
                tty=tty)
        if waited.cancelled_caught:
            # The launcher answers in milliseconds; one that does not is stuck (unsandboxed,
            # a command of the session can stop it; sandboxed, the host can). Nothing can be
            # started or supervised there any more: end the sandbox.
            await session.launcher.aclose()
            raise LauncherDied("the launcher did not answer")
    except LauncherDied:
        raise SandboxError(Fault.CLOSED, f"session {session.id} is closed or its sandbox "
                           f"died; open a new session") from None
    except LauncherLimit as e:
        raise SandboxError(Fault.LIMIT, f"could not start {what or argv[0]}: {e}; the "
                           f"session is at its process limit (limits.pids "
                           f"{session.limits.pids}): wait for commands to end or stop "
                           f"background processes") from None
    except LauncherError as e:
        raise SandboxError(fault, f"could not start {what or argv[0]}: {e}") from None
    return job


async def spawn_with_pipe(session, argv: list[str], *, cwd: str, env: dict[str, str],
                          extra_fds=(), want_pid: bool = True, held: bool = False,
                          stdin: int | None = None, tty: tuple[int, int] | None = None):
    """Spawn `argv` in the session with stdin /dev/null (or the fd `stdin`, which stays the
    caller's) and stdout+stderr one pipe. Returns (job, read_fd); the caller owns read_fd.
    With `tty` (cols, rows) fds 0-2 are a new terminal instead, and read_fd is its master
    side, which the process's input is written to as well."""
    if tty is not None:
        return await spawn_with_terminal(session, argv, cwd=cwd, env=env, tty=tty,
                                         extra_fds=extra_fds, want_pid=want_pid, held=held)
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    devnull = open_devnull()
    try:
        job = await spawn(session, argv, cwd=cwd, env=env,
                          stdin=devnull if stdin is None else stdin, stdout=write_fd,
                          stderr=write_fd, extra_fds=extra_fds, want_pid=want_pid, held=held)
    except BaseException:  # also cancelled: the client went away mid-spawn
        os.close(read_fd)
        raise
    finally:
        # Our copies of the child's ends: the child has the only ones now, so its exit
        # (and its tree's) gives us EOF.
        os.close(write_fd)
        os.close(devnull)
    return job, read_fd


async def spawn_with_terminal(session, argv: list[str], *, cwd: str, env: dict[str, str],
                              tty: tuple[int, int], **options):
    """spawn_with_pipe's `tty` case: (job, the terminal's master side, the caller's)."""
    devnull = open_devnull()
    try:
        job = await spawn(session, argv, cwd=cwd, env=env, stdin=devnull, stdout=devnull,
                          stderr=devnull, tty=tty, **options)
    finally:
        os.close(devnull)
    master, job.terminal_fd = job.terminal_fd, -1
    if master == -1:  # the launcher never sends a `started` without it for a tty request
        raise SandboxError(Fault.REFUSED, f"could not start {argv[0]} on a terminal: the sandbox "
                           f"launcher gave none back; start it without tty")
    return job, master


async def spawn_shell(session, command: str, *, cwd: str, env: dict[str, str],
                      extra_fds=(), want_pid: bool = True, held: bool = False, **options):
    """spawn_with_pipe for `command` run by the session's shell, however big it is (see
    shell_argv): `extra_fds` are the shell's fds 3, 4, ... as for spawn_with_pipe; a big
    command's own comes after them; `options` are spawn_with_pipe's `stdin` and `tty`.
    Returns (job, read_fd)."""
    _shell_name, shell_path = session.shell
    script_fd = 3 + len(extra_fds)
    try:
        argv, script = shell_argv(shell_path, command, script_fd)
    except ValueError as e:
        raise SandboxError(Fault.REFUSED, str(e)) from None
    if script is None:
        return await spawn_with_pipe(session, argv, cwd=cwd, env=env, extra_fds=extra_fds,
                                     want_pid=want_pid, held=held, **options)
    script_file = memory_file(script)
    try:
        return await spawn_with_pipe(session, argv, cwd=cwd, env=env,
                                     extra_fds=[*extra_fds, script_file], want_pid=want_pid,
                                     held=held, **options)
    finally:
        os.close(script_file)  # the shell has its own copy, and closes it before the command


def memory_file(data: bytes) -> int:
    """A memfd holding `data`, at offset 0."""
    fd = os.memfd_create("toolsd-command", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
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
