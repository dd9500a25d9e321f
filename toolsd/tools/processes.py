"""The process.* methods: start a background process, read its output (with `until`), stop
it, list them. The process itself is background_process.py's BackgroundProcess; process_table.py's
ProcessTable keeps the registry of them (and forgets the oldest finished ones).
"""

from __future__ import annotations

import contextlib
import os
from functools import partial
from typing import TYPE_CHECKING, Callable

import msgspec
import trio

from toolsd.runtime import threads
from toolsd.runtime.child_fds import ChildFds
from toolsd.sandbox.errors import SandboxError
from toolsd.sandbox.launch.spawning import signal_name, spawn_shell
from toolsd.tools.background_process import CPU_THREADS, BackgroundProcess, remove_log
from toolsd.tools import input_wait
from toolsd.tools.process_names import check_name
from toolsd.tools.capped_log import CappedLog
from toolsd.tools.live_output import Follower
from toolsd.tools.output import head_piece, tail_piece
from toolsd.tools.plain_text import strip_escapes
from toolsd.tools.terminal_input import ProcessInput, no_input, terminal_env
from toolsd.tools.until import compile_until
from toolsd.wire.process_input import (
    ProcessResizeParams,
    ProcessResizeResult,
    ProcessWriteParams,
    ProcessWriteResult,
)
from toolsd.wire.protocol import (
    BAD_PARAMS,
    IO_ERROR,
    LIMIT_EXCEEDED,
    MARKER,
    SESSION_CLOSED,
    ProcessListParams,
    ProcessListResult,
    ProcessOutputParams,
    ProcessOutputResult,
    ProcessStartParams,
    ProcessStartResult,
    ProcessStopParams,
    ProcessStopResult,
    ToolsdError,
)

if TYPE_CHECKING:
    from toolsd.tools.session_view import SessionView
    from toolsd.tools.process_table import ProcessTable
    from toolsd.tools.answers import Answer

LOG_CAP_BYTES = 64 << 20  # older output on disk, per process
# Background processes a session may have that have not finished (running, or exited with
# something of their tree still holding the output pipe): each holds a log descriptor, a pipe
# and up to RING_BYTES of memory.
MAX_LIVE_PER_SESSION = 128
# A rendering of more bytes than this runs in a worker thread (as a long `until` search step
# does: background.INLINE_SEARCH_WORK), so the event loop keeps serving every other request.
INLINE_RENDER_BYTES = 32 << 10


# ---------------------------------------------------------------- methods


async def start(table: ProcessTable, session: SessionView,
                p: ProcessStartParams) -> ProcessStartResult:
    session.check_open()
    if not p.command.strip():
        raise ToolsdError(BAD_PARAMS, "process.start: command is empty; give the command to run")
    check_name(p.name)
    if session.nursery is None:
        raise ToolsdError(SESSION_CLOSED, f"session {session.id} is not running; open a new one")
    cwd = session.resolve_cwd(p.cwd)
    env = session.command_env(p.env)
    # None in the sandbox: refused before an id is taken.
    _shell_name, shell_path = session.sandbox.shell
    live = sum(1 for bg in table.of(session.id).values() if not bg.finished.is_set())
    if live >= MAX_LIVE_PER_SESSION:
        raise ToolsdError(LIMIT_EXCEEDED, f"process.start: session {session.id} already has "
                          f"{live} background processes that have not finished, the most it "
                          f"may have; stop some with process.stop (toolsd kill ID) first")
    process_id = table.new_id()
    # The log first: once the command runs, nothing may fail before its watcher owns it.
    try:
        log_file = CappedLog(table.log_path(process_id), LOG_CAP_BYTES)
    except OSError as e:
        raise ToolsdError(IO_ERROR, f"process.start: cannot create the log file in "
                          f"{table.logs} ({e.strerror}); free disk space or fix "
                          f"the state folder's permissions") from None
    oom_kills = session.oom_kills()
    source, options = None, {}
    if p.tty:
        options["tty"] = (p.cols, p.rows)
        env = terminal_env(env, p.env)
    try:
        with ChildFds() as fds:  # the command's stdin is its own copy once it runs
            if p.stdin == "pipe" and not p.tty:
                source, stdin = ProcessInput.pipe(process_id)
                fds.ours(source)
                options["stdin"] = fds.child(stdin)
            job, read_fd = await spawn_shell(session.sandbox, shell_path, p.command, cwd=cwd,
                                             env=env, **options)
            if p.tty:
                # Our own copy for writes: the pump closes read_fd at the terminal's end.
                source = fds.ours(ProcessInput(process_id, os.dup(read_fd), terminal=True))
    except (ToolsdError, SandboxError):
        remove_log(log_file, process_id)
        # The session may have closed while we spawned (its launcher's refusal then reads
        # like a bad command): say what really happened.
        session.check_open()
        raise
    except BaseException:
        remove_log(log_file, process_id)
        raise
    if session.closed:
        # Closed while we spawned: its sandbox ends the command; nobody would watch it here.
        os.close(read_fd)
        if source is not None:
            source.close()
        remove_log(log_file, process_id)
        raise ToolsdError(SESSION_CLOSED, f"process.start: session {session.id} was closed "
                          f"while the command started; open a new session")
    proc = BackgroundProcess(process_id, session, p.command, p.name, job, log_file, oom_kills,
                             source)
    table.add(proc)
    session.keep_active(job)
    session.start_soon(proc.watch, read_fd)
    return ProcessStartResult(id=process_id, pid=job.pid)


async def output(proc: BackgroundProcess, p: ProcessOutputParams, answer: Answer | None = None,
                 end_known=None) -> ProcessOutputResult:
    """`answer`: the request's, for its output events (`p.stream`). `end_known(end)`: told
    where the read ends, the moment that is known (a stream ends there)."""
    until = None
    if p.until is not None:
        try:
            until = compile_until(p.until)
        except ValueError as e:
            raise ToolsdError(BAD_PARAMS, f"process.output: {e}") from None
    if p.stream and p.wait_s > 0 and answer is not None:
        return await _output_streamed(proc, p, answer)
    deadline = trio.current_time() + p.wait_s
    while True:
        start = read_start(proc, p)
        if p.wait_s > 0:
            with trio.move_on_at(deadline):
                await proc.wait_for(start, until)
        if p.since is None and proc.read_mark > start:
            # Another reader of the shared mark took this output while we waited: each byte
            # goes to one of them, so wait on from the new mark while time is left.
            start = proc.read_mark
            if (start >= proc.ring.end and not proc.finished.is_set()
                    and trio.current_time() < deadline):
                continue
        break
    if p.wait_s > 0 and not proc.running:
        # Woken by an exit that a stop under way caused, maybe: the status waits for it.
        with trio.move_on_at(deadline):
            await proc.settled()
    end = proc.ring.end
    if end_known is not None:
        end_known(end)  # a stream of this read ends there, told before more can come
    if p.since is None:
        # Taken before rendering (which may let other tasks run), so that a concurrent
        # reader of the shared mark starts after this read's output.
        proc.read_mark = max(proc.read_mark, end)
    rendered = await read_range(proc, start, end, p.max_output_chars)
    return output_result(proc, p, end, rendered, await input_wait.waiting(proc))


def read_start(proc: BackgroundProcess, p: ProcessOutputParams) -> int:
    """Where a read starts: its `since` or the shared mark. A stale or foreign offset past
    the end reads from the end rather than waiting for output that may never come."""
    return min(proc.read_mark if p.since is None else p.since, proc.ring.end)


def output_result(proc: BackgroundProcess, p: ProcessOutputParams, end: int,
                   rendered: tuple[str, bool, int], waiting: bool) -> ProcessOutputResult:
    text, truncated, dropped = rendered
    return ProcessOutputResult(
        id=proc.id, status=proc.status, exit_code=proc.job.exit_code,
        signal=signal_name(proc.job.signal), output=strip_escapes(text) if p.plain else text,
        next=end, dropped_bytes=dropped, truncated=truncated, waiting_for_input=waiting)


async def write(proc: BackgroundProcess, p: ProcessWriteParams) -> ProcessWriteResult:
    """Never waits for the process: what it does not take now comes back as a short count."""
    source = proc.input
    if source is None:
        raise no_input(proc.id)
    data = p.data.encode(errors="surrogatepass")
    if source.open and proc.running and source.terminal and source.wakes_reader(data):
        # Taken before the write: a reader still at these counts has not seen it yet.
        before = await input_wait.switches_now(proc)
    else:
        before = None
    if not proc.running:
        source.close()  # its exit may not have been noted yet: refuse as it will be
    elif proc.output_done.is_set():
        source.terminal_closed()
    written = source.write(data, p.eof)
    if before is not None and written:
        source.before_write = before
    return ProcessWriteResult(written=written)


async def resize(proc: BackgroundProcess, p: ProcessResizeParams) -> ProcessResizeResult:
    if proc.input is None or not proc.input.terminal:
        raise ToolsdError(BAD_PARAMS, f"process.resize: {proc.id} has no terminal (it was "
                          f"started without tty: true); nothing to resize")
    if not proc.running:
        proc.input.close()
    proc.input.resize(p.cols, p.rows)
    return ProcessResizeResult()


async def _output_streamed(proc: BackgroundProcess, p: ProcessOutputParams,
                           answer: Answer) -> ProcessOutputResult:
    """process.output with `stream`: the output from the read's start as it comes, then up to
    the answer's `next`, as events; so the same range as the answer's `output`, unless
    another reader of the shared mark took part of it meanwhile."""
    start = min(proc.read_mark if p.since is None else p.since, proc.ring.end)
    follower = Follower(proc, start, answer.emit, strip_escapes if p.plain else None)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(follower.follow)
        return await output(proc, msgspec.structs.replace(p, stream=False),
                            end_known=follower.end_at)


async def read_range(proc: BackgroundProcess, start: int, end: int, max_chars: int):
    """The output between `start` and `end` as text within `max_chars` characters: all of it
    when it fits, else its head and its tail around one marker line that says where to read
    the rest. Returns (text, truncated, dropped_bytes). The bytes are read here (the ring
    changes as output comes); a large rendering runs in a worker thread."""
    fit, dropped, small = _range(proc, start, end, max_chars)
    if small:
        text, truncated = fit()
    else:
        text, truncated = await trio.to_thread.run_sync(fit, limiter=threads.limiter("render", CPU_THREADS))
    return text, truncated, dropped


def read_range_now(proc: BackgroundProcess, start: int, end: int,
                   max_chars: int) -> tuple[str, bool, int] | None:
    """read_range in the event loop, or None if its rendering is large (read_range then does
    it in a thread)."""
    fit, dropped, small = _range(proc, start, end, max_chars)
    return (*fit(), dropped) if small else None


def _range(proc: BackgroundProcess, start: int, end: int, max_chars: int):
    """(the rendering of the range to call, dropped_bytes, whether that is small enough for
    the event loop), its bytes read now."""
    if start >= end:
        return lambda: ("", False), 0, True
    # A character renders from 1 to 4 bytes (and an invalid byte as 4 chars): read enough
    # bytes to know whether the whole range fits, and for the tail if it does not.
    data, nxt, dropped = proc.read(start, min(end - start, 4 * max_chars + 4))
    pos = nxt - len(data)
    tail, tail_pos = data, pos
    if nxt < end:
        want = min(end - pos, 4 * max_chars + 3)
        tail, tail_next, _ = proc.read(end - want, want)
        tail_pos = tail_next - len(tail)
    fit = partial(fit_range, data, pos, tail, tail_pos, end, max_chars)
    small = len(data) + (len(tail) if tail is not data else 0) <= INLINE_RENDER_BYTES
    return fit, dropped, small


def fit_range(data: bytes, pos: int, tail: bytes, tail_pos: int, end: int,
              max_chars: int) -> tuple[str, bool]:
    """Pure part of read_range: `data` is the output from `pos`, `tail` the output from
    `tail_pos` up to `end` (the range's end). Linear in max_chars."""
    if pos + len(data) == end:
        text, used = head_piece(data, max_chars, final=True)
        if used == len(data):
            return text, False
    if max_chars == 0:
        return "", True
    marker_room = len(MARKER.format(left=end, since=end))
    if marker_room >= max_chars:
        return head_piece(data, max_chars)[0], True
    budget = (max_chars - marker_room) // 2
    head, head_bytes = head_piece(data, budget)
    head_next = pos + head_bytes
    tail_budget = max_chars - marker_room - len(head)
    lo = max(head_next, end - (4 * tail_budget + 3), tail_pos)
    tail_text, tail_bytes = tail_piece(tail[lo - tail_pos:], tail_budget,
                                       at_boundary=lo == head_next)
    marker = MARKER.format(left=end - tail_bytes - head_next, since=head_next)
    return head + marker + tail_text, True


async def stop(proc: BackgroundProcess, p: ProcessStopParams) -> ProcessStopResult:
    return await proc.stop(p.grace_s)


async def listing(table: ProcessTable, p: ProcessListParams,
                  only: Callable[[BackgroundProcess], bool] | None = None) -> ProcessListResult:
    """process.list; `only`: which processes the caller may see (others are not even
    measured, so how long the answer takes says nothing of them)."""
    procs = _visible(table, p, only)
    with contextlib.ExitStack() as stack:
        shims = _hold_trees(stack, procs)
        if not any(shims):
            return _listed(procs, shims)
        # Each tree is measured from /proc, a read per process of trees of any size.
        return await trio.to_thread.run_sync(_listed, procs, shims)


def listing_now(table: ProcessTable, p: ProcessListParams,
                only: Callable[[BackgroundProcess], bool] | None = None,
                ) -> ProcessListResult | None:
    """process.list in the event loop when no listed process has a tree left to measure
    (all finished: what they show is in memory); else None, and `listing` measures them."""
    procs = _visible(table, p, only)
    with contextlib.ExitStack() as stack:
        shims = _hold_trees(stack, procs)
        return None if any(shims) else _listed(procs, shims)


def _hold_trees(stack: contextlib.ExitStack, procs: list[BackgroundProcess]) -> list[int | None]:
    """Each process's tree, held until `stack` closes (Job.holding_tree), but for one with
    no tree to hold (Job.tree_gone: a finished one's is gone for good), which gives None
    without the hold's context manager."""
    return [None if bg.job.tree_gone else stack.enter_context(bg.job.holding_tree())
            for bg in procs]


def _visible(table: ProcessTable, p: ProcessListParams,
             only: Callable[[BackgroundProcess], bool] | None) -> list[BackgroundProcess]:
    procs = table.listed(p.session)
    return procs if only is None else [bg for bg in procs if only(bg)]


def _listed(procs: list[BackgroundProcess], shims: list[int | None]) -> ProcessListResult:
    return ProcessListResult(processes=[bg.info(shim) for bg, shim in zip(procs, shims)])


def waits_for_nothing(p: ProcessOutputParams) -> bool:
    """Whether a read has no wait_s and no until: only such a read can be `output_now` (the
    row's `now_if` asks it first)."""
    return not p.wait_s > 0 and p.until is None


def output_now(proc: BackgroundProcess, p: ProcessOutputParams) -> ProcessOutputResult | None:
    """process.output that waits for nothing (waits_for_nothing), answered in the event
    loop; None, having changed nothing, when that cannot be (see result_now): `output` then
    does it."""
    result = result_now(proc, p, read_start(proc, p))
    if result is not None:
        took(proc, p, result)
    return result


def result_now(proc: BackgroundProcess, p: ProcessOutputParams,
               start: int) -> ProcessOutputResult | None:
    """The output from `start` to its end as `p` asks, rendered in the event loop; None when
    that cannot be (it renders large, or whether the process waits for input needs a look at
    its tree). Moves no mark: `took` does, once the result is the answer."""
    waiting = input_wait.waiting_now(proc)
    if waiting is None:
        return None
    end = proc.ring.end
    rendered = read_range_now(proc, start, end, p.max_output_chars)
    if rendered is None:
        return None
    return output_result(proc, p, end, rendered, waiting)


def took(proc: BackgroundProcess, p: ProcessOutputParams, result: ProcessOutputResult) -> None:
    """`result` is a read's answer: a read of the shared mark (`since` absent) moves it."""
    if p.since is None:
        proc.read_mark = max(proc.read_mark, result.next)
