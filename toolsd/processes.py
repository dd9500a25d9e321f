"""Background processes: `bgN` ids that are never reused, output kept for reading while they
run, and a stop that ends the whole tree.

Resource handling: a BackgroundProcess belongs to its session; its task (`watch`) runs in the
session's nursery and pumps output into a ring (recent output, in memory) and a capped log
file (older output, on disk). `stop()` ends every process of its tree through its shim, which
every orphan of the tree reparents to; session close and daemon shutdown call it for each one
still running. When the session's nursery ends, the task retires the process: the log file is
closed and removed and the ring shrunk to a short tail, so a finished process kept for its
final status costs little.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import time

import psutil
import trio

from . import proctree
from .output import CappedLog, Ring, render
from .protocol import (
    BAD_PARAMS,
    IO_ERROR,
    SESSION_CLOSED,
    ProcessInfo,
    ProcessListResult,
    ProcessOutputParams,
    ProcessOutputResult,
    ProcessStartParams,
    ProcessStartResult,
    ProcessStopResult,
    ToolsdError,
)
from .shell import pump, signal_name, spawn_with_pipe

logger = logging.getLogger("toolsd.processes")

RING_BYTES = 1 << 20  # recent output in memory
LOG_CAP_BYTES = 64 << 20  # older output on disk, per process
# What a process of a closed session keeps of its output (its log file is gone by then).
RETIRED_RING_BYTES = 64 << 10
# How far back into output already searched an `until` regex looks again when new output
# comes, so a match split across two reads is still found without rescanning everything.
UNTIL_OVERLAP_BYTES = 64 << 10
# After the command exits, how long a waiting read gives the pipe to deliver the command's
# last output before it answers (a child holding the pipe may keep it open for ever).
EXIT_DRAIN_S = 0.1
# How long stop() waits for the launcher to report the exit after the tree was killed.
EXIT_REPORT_S = 5.0


class BackgroundProcess:
    def __init__(self, process_id: str, session, command: str, name: str, job,
                 log_file: CappedLog):
        self.id = process_id
        self.session = session
        self.command = command
        self.name = name
        self.job = job
        self.pid = job.pid
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.ring = Ring(RING_BYTES)
        self.log: CappedLog | None = log_file
        self.read_mark = 0
        self.stopped = False  # ended by process.stop / session close rather than on its own
        self.output_done = trio.Event()  # the pipe reached EOF (or the session ended)
        self.finished = trio.Event()  # exited, and its last output read (or drain time over)
        self._changed = trio.Event()
        # The shim's identity (pid and start time): checked before each use of its pid, since
        # once it has exited and been reaped the pid may name an unrelated process.
        self._shim = _identity(job.shim_pid)
        self._cpu_samples: dict[int, tuple[psutil.Process, float, float]] = {}

    # ------------------------------------------------------------ state

    @property
    def running(self) -> bool:
        return not self.job.exited.is_set()

    @property
    def status(self) -> str:
        if self.running:
            return "running"
        return "stopped" if self.stopped else "exited"

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def feed(self, data: bytes) -> None:
        self.ring.append(data)
        if self.log is not None:
            try:
                self.log.append(data)
            except OSError as e:
                # A full disk must not take the session down: keep the ring, lose the log.
                logger.warning("%s: log file failed (%s); keeping only the last %d bytes in "
                            "memory", self.id, e, RING_BYTES)
                self._drop_log()
        self._notify()

    async def watch(self, read_fd: int) -> None:
        """The process's task: pump its output until EOF, note its exit, and retire the
        process when the session's nursery is cancelled (session close)."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._wait_exit)
                try:
                    await pump(read_fd, self.feed)
                finally:
                    self.output_done.set()
                    self._notify()
            await trio.sleep_forever()
        finally:
            self._retire()

    async def _wait_exit(self) -> None:
        await self.job.exited.wait()
        self.ended_at = time.time()
        self._notify()
        with trio.move_on_after(EXIT_DRAIN_S):
            await self.output_done.wait()
        self.finished.set()
        self._notify()

    def _retire(self) -> None:
        self._shim = None  # gone with the session's sandbox
        self.output_done.set()
        self.finished.set()
        if self.ended_at is None:
            self.ended_at = time.time()
        self._drop_log()
        lo = max(self.ring.start, self.ring.end - RETIRED_RING_BYTES)
        kept, _next, _dropped = self.ring.read(lo, self.ring.end - lo)
        small = Ring(max(1, len(kept)))
        small.end = self.ring.end - len(kept)
        small.append(kept)
        self.ring = small
        self._notify()

    def _drop_log(self) -> None:
        if self.log is None:
            return
        self.log.close()
        for path in (self.log.path, self.log.old_path):
            try:
                os.unlink(path)
            except OSError as e:
                if e.errno != errno.ENOENT:
                    logger.warning("%s: cannot remove %s: %s", self.id, path, e)
        self.log = None

    # ------------------------------------------------------------ reading

    def read(self, since: int, limit: int) -> tuple[bytes, int, int]:
        """Bytes from `since` (at most `limit`), the offset after them, and how many bytes
        between `since` and the oldest byte still kept are gone."""
        if since >= self.ring.start or self.log is None:
            return self.ring.read(since, limit)
        return self.log.read(since, limit)

    async def wait_for(self, start: int, until: re.Pattern | None) -> None:
        """Wait for output past `start` (matching `until` if given) or for the end of the
        process. Woken by each chunk of output, never by a timer; the caller bounds it.
        `until` is matched against output still in memory (the last RING_BYTES)."""
        scanned = start  # `until` found nothing in [start, scanned)
        while True:
            end = self.ring.end
            if until is None:
                if end > start:
                    return
            elif end > scanned:
                if self._search(until, start, scanned, end):
                    return
                scanned = end
            if self.finished.is_set():
                return
            changed = self._changed
            await changed.wait()

    def _search(self, until: re.Pattern, start: int, scanned: int, end: int) -> bool:
        lo = max(start, scanned - UNTIL_OVERLAP_BYTES, self.ring.start)
        data, _next, _dropped = self.ring.read(lo, end - lo)
        if lo > start:
            # Start the window at a line start, so `^` in the pattern means what it says.
            cut = data.find(b"\n", 0, max(0, scanned - lo))
            if cut >= 0:
                data = data[cut + 1:]
        return until.search(render(data)) is not None

    # ------------------------------------------------------------ stopping

    async def stop(self, grace_s: float) -> ProcessStopResult:
        was_running = self.running
        ended = survivors = 0
        if _alive(self._shim):
            ended, survivors = await trio.to_thread.run_sync(
                lambda: proctree.kill_tree(self._shim.pid, grace_s=grace_s,
                                           include_root=False))
        if was_running:
            self.stopped = True
        with trio.move_on_after(EXIT_REPORT_S):
            await self.job.exited.wait()
        if self.ended_at is None and not self.running:
            self.ended_at = time.time()
        return ProcessStopResult(id=self.id, status=self.status, exit_code=self.job.exit_code,
                                 signal=signal_name(self.job.signal), ended=ended,
                                 survivors=survivors)

    def info(self) -> ProcessInfo:
        """What `process.list` shows. cpu_percent and rss_bytes are the sums over the whole
        tree (a `bash -c` wrapper uses nothing; the server under it is what matters). Blocking:
        call it from a thread."""
        cpu, rss, tree = 0.0, 0, []
        if _alive(self._shim):
            tree = proctree.descendants(self._shim.pid)
        now = time.monotonic()
        samples = {}
        for proc in tree:
            try:
                with proc.oneshot():
                    times = proc.cpu_times()
                    used = times.user + times.system
                    rss += proc.memory_info().rss
                    before = self._cpu_samples.get(proc.pid)
                    if before is not None and before[0] == proc and now > before[2]:
                        cpu += 100.0 * (used - before[1]) / (now - before[2])
                    else:
                        # First sight: the average over its life, as ps(1) shows it.
                        age = max(time.time() - proc.create_time(), 1e-3)
                        cpu += 100.0 * used / age
                    samples[proc.pid] = (proc, used, now)
            except psutil.Error:
                continue
        self._cpu_samples = samples
        return ProcessInfo(
            id=self.id, session=self.session.id, name=self.name, command=self.command,
            pid=self.pid, status=self.status, exit_code=self.job.exit_code,
            started_at=self.started_at, ended_at=self.ended_at, cpu_percent=round(cpu, 1),
            rss_bytes=rss, descendants=max(0, len(tree) - (1 if self.running else 0)),
            output_bytes=self.ring.end)


def _identity(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid) if pid > 0 else None
    except psutil.Error:
        return None


def _alive(proc: psutil.Process | None) -> bool:
    # is_running compares the start time too: a reused pid is not the process we knew.
    return proc is not None and proc.is_running()


# ---------------------------------------------------------------- methods


async def start(supervisor, session, p: ProcessStartParams) -> ProcessStartResult:
    session.check_open()
    if not p.command.strip():
        raise ToolsdError(BAD_PARAMS, "process.start: command is empty; give the command to run")
    if session.nursery is None:
        raise ToolsdError(SESSION_CLOSED, f"session {session.id} is not running; open a new one")
    cwd = session.resolve_cwd(p.cwd)
    env = session.command_env(p.env)
    _shell_name, shell_path = session.shell
    process_id = f"bg{supervisor.state.next_id('process')}"
    # The log first: once the command runs, nothing may fail before its watcher owns it.
    try:
        log_file = CappedLog(os.path.join(supervisor.state.logs, f"{process_id}.log"),
                             LOG_CAP_BYTES)
    except OSError as e:
        raise ToolsdError(IO_ERROR, f"process.start: cannot create the log file in "
                          f"{supervisor.state.logs} ({e.strerror}); free disk space or fix "
                          f"the state folder's permissions") from None
    try:
        job, read_fd = await spawn_with_pipe(session, [shell_path, "-c", p.command], cwd=cwd,
                                             env=env)
    except BaseException:
        log_file.close()
        for path in (log_file.path, log_file.old_path):
            try:
                os.unlink(path)
            except OSError:
                pass
        raise
    proc = BackgroundProcess(process_id, session, p.command, p.name, job, log_file)
    supervisor.processes[process_id] = proc
    session.processes[process_id] = proc
    forget_oldest_finished(supervisor)
    session.nursery.start_soon(proc.watch, read_fd)
    return ProcessStartResult(id=process_id, pid=job.pid)


# Finished processes are remembered (status, last output) so that a stale id gets its final
# status; past this many, the oldest finished ones are forgotten and their ids are not_found.
MAX_REMEMBERED = 1000


def forget_oldest_finished(supervisor) -> None:
    excess = len(supervisor.processes) - MAX_REMEMBERED
    if excess <= 0:
        return
    for process_id, proc in list(supervisor.processes.items()):
        if excess <= 0:
            break
        if not proc.running and proc.output_done.is_set():
            del supervisor.processes[process_id]
            proc.session.processes.pop(process_id, None)
            excess -= 1


async def output(proc: BackgroundProcess, p: ProcessOutputParams) -> ProcessOutputResult:
    until = None
    if p.until is not None:
        try:
            until = re.compile(p.until)
        except re.error as e:
            raise ToolsdError(BAD_PARAMS, f"process.output: until is not a valid regular "
                              f"expression ({e}); fix the pattern") from None
    deadline = trio.current_time() + p.wait_s
    while True:
        # A stale or foreign offset past the end reads from the end rather than waiting for
        # output that may never come.
        start = min(proc.read_mark if p.since is None else p.since, proc.ring.end)
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
    end = proc.ring.end
    text, truncated, dropped = read_range(proc, start, end, p.max_output_chars)
    if p.since is None:
        proc.read_mark = max(proc.read_mark, end)
    return ProcessOutputResult(
        id=proc.id, status=proc.status, exit_code=proc.job.exit_code,
        signal=signal_name(proc.job.signal), output=text, next=end,
        dropped_bytes=dropped, truncated=truncated)


# The marker between head and tail of a read that does not fit; `toolsd logs` reads the
# `since=` in it to carry on right after the head.
MARKER = "\n[... {left} bytes left out; process.output with since={since} reads them ...]\n"
MARKER_SINCE = re.compile(r"\n\[\.\.\. \d+ bytes left out; process\.output with since=(\d+) "
                          r"reads them \.\.\.\]\n")


def read_range(proc: BackgroundProcess, start: int, end: int, max_chars: int):
    """The output between `start` and `end` as text within `max_chars` characters: all of it
    when it fits, else its head and its tail around one marker line that says where to read
    the rest. Returns (text, truncated, dropped_bytes)."""
    if start >= end:
        return "", False, 0
    # A character renders from 1 to 4 bytes (and an invalid byte as 4 chars): read enough
    # bytes to know whether the whole range fits.
    data, nxt, dropped = proc.read(start, min(end - start, 4 * max_chars + 4))
    pos = nxt - len(data)
    if nxt == end:
        text = render(data)
        if len(text) <= max_chars:
            return text, False, dropped
    if max_chars == 0:
        return "", True, dropped
    marker_room = len(MARKER.format(left=end, since=end))
    if marker_room >= max_chars:
        head, _used = fit_head(data, max_chars)
        return head, True, dropped
    budget = (max_chars - marker_room) // 2
    head, head_bytes = fit_head(data, budget)
    head_next = pos + head_bytes
    tail_budget = max_chars - marker_room - len(head)
    want = min(end - head_next, 4 * tail_budget + 3)
    tail_data, _next, _ = proc.read(end - want, want)
    tail, tail_bytes = fit_tail(tail_data, tail_budget)
    marker = MARKER.format(left=end - tail_bytes - head_next, since=head_next)
    return head + marker + tail, True, dropped


def _complete_prefix(data: bytes) -> bytes:
    """`data` without a UTF-8 sequence cut off by its end (the next read starts there)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return data
        if byte >= 0xC0:  # a lead byte: is its sequence complete?
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return data if back >= need else data[:-back]
    return data


def _skip_continuations(data: bytes) -> bytes:
    skip = 0
    while skip < 3 and skip < len(data) and 0x80 <= data[skip] <= 0xBF:
        skip += 1
    return data[skip:]


def fit_head(data: bytes, budget: int) -> tuple[str, int]:
    """The longest rendered prefix of `data` within `budget` chars, and its byte length."""
    lo, hi = 0, min(len(data), 4 * budget + 3)
    best = ("", 0)
    while lo <= hi:
        mid = (lo + hi) // 2
        piece = _complete_prefix(data[:mid])
        text = render(piece)
        if len(text) <= budget:
            best = (text, len(piece))
            lo = mid + 1
        else:
            hi = mid - 1
    return best


def fit_tail(data: bytes, budget: int) -> tuple[str, int]:
    """The longest rendered suffix of `data` within `budget` chars, and its byte length."""
    lo, hi = 0, min(len(data), 4 * budget + 3)
    best = ("", 0)
    while lo <= hi:
        mid = (lo + hi) // 2
        piece = _skip_continuations(data[len(data) - mid:]) if mid else b""
        text = render(piece)
        if len(text) <= budget:
            best = (text, len(piece))
            lo = mid + 1
        else:
            hi = mid - 1
    return best


async def stop(proc: BackgroundProcess, p) -> ProcessStopResult:
    return await proc.stop(p.grace_s)


async def listing(supervisor, p) -> ProcessListResult:
    procs = [bg for bg in supervisor.processes.values()
             if p.session is None or bg.session.id == p.session]
    infos = await trio.to_thread.run_sync(lambda: [bg.info() for bg in procs])
    return ProcessListResult(processes=infos)
