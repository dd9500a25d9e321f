"""shell.run: one command in the session's sandbox, its output bounded, its tree ended.

The call returns when the command's own process exits. Whatever it left running is then ended
(and counted), so that `server &` neither hangs the call nor leaks a process; on timeout or
cancel the whole tree is ended and the output so far returned.
"""

from __future__ import annotations

import os
import re
import signal as signal_module
import time

import trio

from toolsd import answer as answers
from toolsd.sandbox import proctree
from toolsd.runtime import threads
from toolsd.runtime.fdio import READ_SIZE, FdReader
from toolsd.sandbox.launcher import KILL_THREADS, LauncherDied, LauncherError, LauncherLimit
from toolsd.output import HeadTail
from toolsd.sandbox.shell_argv import shell_argv
from toolsd.wire.protocol import (
    BAD_PARAMS,
    LIMIT_EXCEEDED,
    SESSION_CLOSED,
    ShellRunParams,
    ShellRunResult,
    ToolsdError,
)
from toolsd.spill import tee

# After the command exits (and its leftovers are ended) we read what is already in the pipe for
# at most this long: enough to drain a full pipe, short enough that a descriptor smuggled out of
# the tree cannot hold the call.
DRAIN_S = 1.0
# A timed-out or cancelled command gets this long between SIGTERM and SIGKILL.
KILL_GRACE_S = 0.2
# How long after the command's exit we wait for its shim to say the tree is empty before we go
# looking for leftovers ourselves.
LEFTOVER_CHECK_S = 0.05
# A spawn that takes longer than this means the session's launcher is stuck (sandboxed, pid 1
# of its namespace, its code cannot stop it; unsandboxed it can).
SPAWN_TIMEOUT_S = 10.0
# After its tree is killed, how long a job's shim has to report the exit before it is killed
# too (a shim stopped by its own command never would).
SHIM_REPORT_S = 1.0
# `report_cwd`: the shell's EXIT trap writes its folder to fd 3, a pipe of its own, so nothing
# the command prints on its output can pass for it. On the same line as the command, so the
# line numbers of the command's errors stay the same.
CWD_TRAP = "trap 'command pwd >&3' EXIT; "
# At most this much of what reaches fd 3 is kept: a path, and room for one written before it.
CWD_REPORT_MAX = 8192


# git's words when it cannot replace a config file that the sandbox keeps read-only: a
# rename onto a mount point fails with EBUSY, which reads like a lock held by another git.
_GIT_CONFIG_REFUSED = re.compile(
    r"could not (?:write|lock|commit) config file (.+?): "
    r"(?:Device or resource busy|Read-only file system)")


def git_config_notice(output: str, *, global_config: bool) -> str:
    """A line saying why git could not write a config file and what to do instead, if
    `output` has git's message for that; else "". `global_config`: the session has its
    own $GIT_CONFIG_GLOBAL to write to."""
    found = _GIT_CONFIG_REFUSED.search(output)
    if found is None:
        return ""
    instead = ("`git -c name=value ...`, the GIT_AUTHOR_NAME, GIT_AUTHOR_EMAIL, "
               "GIT_COMMITTER_NAME and GIT_COMMITTER_EMAIL variables")
    if global_config:
        instead += (", or `git config --global name value` (it writes the session's own "
                    "$GIT_CONFIG_GLOBAL)")
    return (f"[toolsd: {found[1]} is read-only in this sandbox, because the host's git would "
            f"run what it says (hooks, core.fsmonitor); nothing is wrong with the repository, "
            f"so do not delete or re-create .git. Give settings with {instead}]")


def signal_name(number: int | None) -> str | None:
    if number is None:
        return None
    try:
        return signal_module.Signals(number).name
    except ValueError:
        return f"SIG{number}"


async def pump(fd: int, sink) -> None:
    """Read `fd` into `sink(bytes)` until EOF. Closes the fd."""
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
    finally:
        trio.lowlevel.notify_closing(fd)
        os.close(fd)


def open_devnull() -> int:
    return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)


async def spawn_with_pipe(session, argv: list[str], *, cwd: str, env: dict[str, str],
                          extra_fds=(), want_pid: bool = True, held: bool = False):
    """Spawn `argv` in the session with stdin /dev/null and stdout+stderr one pipe.
    Returns (job, read_fd); the caller owns read_fd."""
    if not session.repositories_known.is_set():
        # A session opened on a big workspace is handed out while its repositories are
        # still being looked at: a command now could change what counts as found at open.
        await session.repositories_known.wait()
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    devnull = open_devnull()
    try:
        with trio.move_on_after(SPAWN_TIMEOUT_S) as waited:
            job = await session.launcher.spawn(
                argv, cwd=cwd, env=env, stdin=devnull, stdout=write_fd, stderr=write_fd,
                rlimits=session.rlimits, extra_fds=extra_fds, want_pid=want_pid, held=held)
        if waited.cancelled_caught:
            # The launcher answers in milliseconds; one that does not is stuck (unsandboxed,
            # a command of the session can stop it). Nothing can be started or supervised
            # there any more: end the sandbox.
            await session.launcher.aclose()
            raise LauncherDied("the launcher did not answer")
    except LauncherDied:
        os.close(read_fd)
        raise ToolsdError(SESSION_CLOSED, f"session {session.id} is closed or its sandbox "
                          f"died; open a new session") from None
    except LauncherLimit as e:
        os.close(read_fd)
        raise ToolsdError(LIMIT_EXCEEDED, f"could not start {argv[0]}: {e}; the session is at "
                          f"its process limit (limits.pids {session.limits.pids}): wait for "
                          f"commands to end or stop background processes") from None
    except LauncherError as e:
        os.close(read_fd)
        raise ToolsdError(BAD_PARAMS, f"could not start {argv[0]}: {e}") from None
    except BaseException:  # cancelled: the client went away mid-spawn
        os.close(read_fd)
        raise
    finally:
        # Our copies of the child's ends: the child has the only ones now, so its exit
        # (and its tree's) gives us EOF.
        os.close(write_fd)
        os.close(devnull)
    return job, read_fd


async def spawn_shell(session, command: str, *, cwd: str, env: dict[str, str],
                      extra_fds=(), want_pid: bool = True, held: bool = False):
    """spawn_with_pipe for `command` run by the session's shell, however big it is (see
    shell_argv): `extra_fds` are the shell's fds 3, 4, ... as for spawn_with_pipe; a big
    command's own comes after them. Returns (job, read_fd)."""
    _shell_name, shell_path = session.shell
    script_fd = 3 + len(extra_fds)
    try:
        argv, script = shell_argv(shell_path, command, script_fd)
    except ValueError as e:
        raise ToolsdError(BAD_PARAMS, str(e)) from None
    if script is None:
        return await spawn_with_pipe(session, argv, cwd=cwd, env=env, extra_fds=extra_fds,
                                     want_pid=want_pid, held=held)
    script_file = _memory_file(script)
    try:
        return await spawn_with_pipe(session, argv, cwd=cwd, env=env,
                                     extra_fds=[*extra_fds, script_file], want_pid=want_pid,
                                     held=held)
    finally:
        os.close(script_file)  # the shell has its own copy, and closes it before the command


def _memory_file(data: bytes) -> int:
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


async def run(session, p: ShellRunParams) -> ShellRunResult:
    session.check_open()
    cwd = session.resolve_cwd(p.cwd)
    env = session.command_env(p.env)
    oom_kills = session.oom_kills()
    shell_name, _shell_path = session.shell
    started = time.monotonic()
    command, cwd_fds = p.command, None
    if p.report_cwd:
        command, cwd_fds = CWD_TRAP + p.command, os.pipe2(os.O_CLOEXEC)
    try:
        job, read_fd = await spawn_shell(
            session, command, cwd=cwd, env=env, want_pid=False, held=True,
            extra_fds=cwd_fds[1:] if cwd_fds else ())
    except BaseException:
        if cwd_fds:
            os.close(cwd_fds[0])
        raise
    finally:
        if cwd_fds:
            os.close(cwd_fds[1])  # the shell has the only copy: its tree's end gives EOF
    # The shim goes back to the launcher's standbys once the answer is out: letting it go
    # wakes it, and that is no reason to answer later.
    answer = answers.current()
    spill = session.spills.start(p.max_output_chars) if p.spill else None
    try:
        return await _finish(session, job, read_fd, p, shell_name, started, oom_kills,
                             cwd_fds[0] if cwd_fds else None, spill)
    finally:
        if spill is not None:
            spill.discard()  # a no-op once its result has it
        if answer is None:
            job.let_go()
        else:
            answer.after(job.let_go)


async def _finish(session, job, read_fd: int, p: ShellRunParams, shell_name: str,
                  started: float, oom_kills: int | None, cwd_fd: int | None,
                  spill) -> ShellRunResult:
    """Collect the output and the end of a shell.run's command, ending what it leaves.
    `oom_kills`: the session's count before the command started (Session.memory_note)."""
    out = HeadTail(p.max_output_chars)
    sink = out.feed if spill is None else tee(out.feed, spill.feed)
    cwd_report = bytearray()
    timed_out = False
    orphans = 0
    try:
        async with trio.open_nursery() as nursery:
            reader_done = trio.Event()

            async def read_all():
                try:
                    async with trio.open_nursery() as readers:
                        readers.start_soon(pump, read_fd, sink)
                        if cwd_fd is not None:
                            readers.start_soon(pump, cwd_fd, _bounded(cwd_report))
                finally:
                    reader_done.set()

            nursery.start_soon(read_all)
            with trio.move_on_after(p.timeout_s) as deadline:
                await job.exited.wait()
            if deadline.cancelled_caught:
                timed_out = True
                orphans = max(0, (await end_tree(job, KILL_GRACE_S))[0] - 1)
            else:
                # The shim reports `done` as soon as nothing of the tree is left: the usual
                # case, and then there is nothing to look for. (Set events are not waited
                # for: a wait is a pass through the scheduler even then.)
                if not job.done.is_set():
                    with trio.move_on_after(LEFTOVER_CHECK_S):
                        await job.done.wait()
                if not job.done.is_set():
                    orphans = (await end_tree(job, 0))[0]
            if not reader_done.is_set():
                with trio.move_on_after(DRAIN_S):
                    await reader_done.wait()
            nursery.cancel_scope.cancel()
    finally:
        if not job.exited.is_set():
            # Cancelled (the client went away, or a `cancel` request): the tree goes too.
            with trio.CancelScope(shield=True):
                await end_tree(job, KILL_GRACE_S)
    if job.lost and not timed_out:
        # Its exit will never be known: the sandbox ended under it.
        raise ToolsdError(SESSION_CLOSED, f"session {session.id}'s sandbox ended while the "
                          f"command ran ({session.launcher.death_reason()}); open a new "
                          f"session")
    notes = (session.memory_note(oom_kills),
             git_config_notice(out.result()[0], global_config=session.home_is_own))
    output, truncated = out.result_with("\n".join(n for n in notes if n))
    killed = timed_out or job.signal is not None
    return ShellRunResult(
        exit_code=job.exit_code,
        signal=signal_name(job.signal),
        timed_out=timed_out,
        output=output,
        output_bytes=out.total,
        truncated=truncated,
        shell=shell_name,
        duration_s=round(time.monotonic() - started, 6),
        orphans_ended=orphans,
        output_file=spill.finish(truncated) if spill is not None else None,
        cwd_after=None if cwd_fd is None or killed else reported_cwd(bytes(cwd_report)),
    )


def _bounded(buf: bytearray):
    def feed(data: bytes) -> None:
        buf.extend(data)
        del buf[:-CWD_REPORT_MAX]
    return feed


def reported_cwd(report: bytes) -> str | None:
    """The folder the EXIT trap wrote last (`pwd` and its newline), if it is one: an absolute
    path in UTF-8. Whatever else reached fd 3 (the command may write there too, which can do
    no more than a `cd` could) makes it absent rather than wrong."""
    if not report.endswith(b"\n"):
        return None
    line = report[:-1].rpartition(b"\n")[2]
    try:
        path = line.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return path if path.startswith("/") and "\0" not in path else None


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
