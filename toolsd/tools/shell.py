"""shell.run: one command in the session's sandbox, its output bounded, its tree ended.

The call returns when the command's own process exits. Whatever it left running is then ended
(and counted), so that `server &` neither hangs the call nor leaks a process; on timeout or
cancel the whole tree is ended and the output so far returned.
"""

from __future__ import annotations

import logging
import os
import re
import time
from typing import TYPE_CHECKING

import trio

from toolsd.runtime.child_fds import ChildFds
from toolsd.tools.live_output import LiveOutput, sending
from toolsd.tools.output import HeadTail
from toolsd.runtime.fdio import FdReader, unread
from toolsd.sandbox.launch import proctree
from toolsd.sandbox.launch.spawning import end_tree, pump, read_into, signal_name, spawn_shell
from toolsd.tools.answers import Answer
from toolsd.tools.spill import tee
from toolsd.wire.protocol import SESSION_CLOSED, ShellRunParams, ShellRunResult, ToolsdError

if TYPE_CHECKING:
    from toolsd.tools.session_view import SessionView
    from toolsd.sandbox.launch.job import Job
    from toolsd.tools.spill import Spill

log = logging.getLogger("toolsd.shell")

# After the command exits (and its leftovers are ended) we read what is already in the pipe for
# at most this long: enough to drain a full pipe, short enough that a descriptor smuggled out of
# the tree cannot hold the call.
DRAIN_S = 1.0
# What the output says when its pipe did not end within DRAIN_S of the exit: an answer cut
# there must never pass for the command's whole output.
HELD_OPEN_NOTICE = ("[toolsd: the output did not end within {:g} s of the command's exit "
                    "(a process outside the command's tree holds its output pipe); anything "
                    "written after that is not here]")
# A timed-out or cancelled command gets this long between SIGTERM and SIGKILL.
KILL_GRACE_S = 0.2
# How long after the command's exit we wait for its shim to say the tree is empty before we go
# looking for leftovers ourselves.
LEFTOVER_CHECK_S = 0.05
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


async def run(session: SessionView, p: ShellRunParams, answer: Answer) -> ShellRunResult:
    session.check_open()
    cwd = session.resolve_cwd(p.cwd)
    env = session.command_env(p.env)
    oom_kills = session.oom_kills()
    shell_name, shell_path = session.sandbox.shell
    started = time.monotonic()
    command, cwd_fds = p.command, None
    with ChildFds() as fds:  # the shell has the only copy of its end: EOF at its tree's end
        if p.report_cwd:
            command, cwd_fds = CWD_TRAP + p.command, fds.pipe()
        job, read_fd = await spawn_shell(
            session.sandbox, shell_path, command, cwd=cwd, env=env, want_pid=False, held=True,
            extra_fds=cwd_fds[1:] if cwd_fds else ())
    spill = session.spills.start(p.max_output_chars) if p.spill else None
    live = LiveOutput(answer.emit) if p.stream else None
    try:
        async with sending(live):
            return await _finish(session, job, read_fd, p, shell_name, started, oom_kills,
                                 cwd_fds[0] if cwd_fds else None, spill, live)
    finally:
        if spill is not None:
            spill.discard()  # a no-op once its result has it
        # The shim goes back to the launcher's standbys once the answer is out: letting it
        # go wakes it, and that is no reason to answer later.
        answer.after(job.let_go)


async def _finish(session: SessionView, job: Job, read_fd: int, p: ShellRunParams, shell_name: str,
                  started: float, oom_kills: int | None, cwd_fd: int | None,
                  spill: Spill | None, live: LiveOutput | None) -> ShellRunResult:
    """Collect the output and the end of a shell.run's command, ending what it leaves.
    Closes `read_fd` and `cwd_fd`. `oom_kills`: the session's count before the command
    started (SessionView.memory_note). `live`: the output's way to a streaming client, which
    holds the command while the client is slow, up to the command's end
    (tools/live_output.py)."""
    out = HeadTail(p.max_output_chars)
    sink = out.feed if spill is None else tee(out.feed, spill.feed)
    if live is not None:
        sink = tee(sink, live.feed)
    cwd_report = bytearray()
    try:
        if cwd_fd is None:  # the usual case: no nursery, no task besides this one
            timed_out, orphans, held = await _collect(job, read_fd, sink, live, p.timeout_s)
        else:
            async with trio.open_nursery() as nursery:
                cwd_done = trio.Event()

                async def read_cwd() -> None:
                    try:
                        await pump(cwd_fd, _bounded(cwd_report))
                    finally:
                        cwd_done.set()

                nursery.start_soon(read_cwd)
                timed_out, orphans, held = await _collect(job, read_fd, sink, live,
                                                          p.timeout_s, cwd_done)
                nursery.cancel_scope.cancel()
    finally:
        if not job.exited.is_set():
            # Cancelled (the client went away, or a `cancel` request): the tree goes too.
            with trio.CancelScope(shield=True):
                await end_tree(job, KILL_GRACE_S)
    if job.lost and not timed_out:
        # Its exit will never be known: the sandbox ended under it.
        raise ToolsdError(SESSION_CLOSED, f"session {session.id}'s sandbox ended while the "
                          f"command ran ({session.sandbox.launcher.death_reason()}); open a new "
                          f"session")
    notes = (session.memory_note(oom_kills),
             git_config_notice(out.result()[0], global_config=session.home_is_own),
             HELD_OPEN_NOTICE.format(DRAIN_S) if held else "")
    notice = "\n".join(n for n in notes if n)
    output, truncated = out.result_with(notice)
    if live is not None:
        await live.finish(notice)
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


async def _collect(job: Job, read_fd: int, sink, live: LiveOutput | None, timeout_s: float,
                   cwd_done: trio.Event | None = None) -> tuple[bool, int, bool]:
    """Read the command's output into `sink` until it exits (or times out), end what it
    left, and drain what is left in the pipe for at most DRAIN_S (and the cwd report's, until
    `cwd_done`); closes `read_fd`. (timed out, processes ended after the exit, whether the
    output was still open when the drain gave up).

    The output is read in this task, which the command's exit wakes (Job.cancel_on_exit):
    a reader task of its own, and the nursery it needs, were two passes of the scheduler
    more on every call. The pipe's end (EOF) usually comes first, and then the exit is
    waited for as such."""
    os.set_blocking(read_fd, False)
    # The command has only just started: nothing to read yet, so the first read waits.
    reader = FdReader(read_fd, wait_after_short=True, wait_first=True)
    room = live.room if live is not None else None
    orphans = 0
    try:
        eof = False
        # One scope for the whole wait: the command's exit cancels it, and so does the
        # timeout; `job.exited` tells which (an exit that came with the timeout counts).
        with trio.move_on_after(timeout_s) as until_exit:
            job.cancel_on_exit(until_exit)
            await read_into(reader, sink, room)
            eof = True
            if not job.exited.is_set():
                await job.exited.wait()
        timed_out = not job.exited.is_set()
        if timed_out:
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
        if live is not None:
            live.release()  # the drain below is bounded in time, not by the client
        if not eof or (cwd_done is not None and not cwd_done.is_set()):
            with trio.move_on_after(DRAIN_S):
                if not eof:
                    await read_into(reader, sink, room)
                    eof = True
                if cwd_done is not None:
                    await cwd_done.wait()
            if not eof:
                await _log_held_open(job, read_fd)
    finally:
        # Nothing waits on it (this task's waits are over), and trio forgets a descriptor
        # once its wait ends: a plain close, with no notify_closing (and its epoll_ctl).
        os.close(read_fd)
    return timed_out, orphans, not eof


async def _log_held_open(job: Job, read_fd: int) -> None:
    """Say in the log who holds the output pipe that did not end: a process the command
    passed it to, or (nobody, or bytes waiting unread) a fault of ours to chase."""
    try:
        waiting = unread(read_fd)
        held_by = await trio.to_thread.run_sync(proctree.holders, read_fd)
    except OSError as e:
        waiting, held_by = -1, str(e)
    log.warning("shell.run job %d (%s, shim %d): its output did not end within %g s of its "
                "exit; %d bytes unread; the pipe is held by %s", job.job, job.state.value,
                job.shim_pid, DRAIN_S, waiting, held_by or "no other process")


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
