"""Background processes: `bgN` ids that are never reused, output kept for reading while they
run, and a stop that ends the whole tree.

Resource handling: a BackgroundProcess belongs to its session; its task (`watch`) runs in the
session's nursery and pumps output into a ring (recent output, in memory) and a capped log
file (older output, on disk). `stop()` ends every process of its tree through its shim, which
every orphan of the tree reparents to; session close and daemon shutdown call it for each one
still running. Once the process has exited and its output is drained, the task retires it: the
ring shrinks to a short tail and the log is sealed (its descriptors closed, the file kept for
`toolsd logs`), so a finished process kept for its final status costs little memory and no
descriptor. The task then waits until the process is forgotten or its session closes, and
removes the log file.
"""

from __future__ import annotations

import errno
import logging
import os
import time

import psutil
import trio

from toolsd.runtime import threads
from toolsd.runtime.states import States
from toolsd.sandbox.launch import proctree
from toolsd.sandbox.launch.spawning import end_tree, pump, signal_name
from toolsd.tools.capped_log import CappedLog
from toolsd.tools.output import Ring, clip
from toolsd.tools.until import UntilPattern, UntilScan
from toolsd.wire.protocol import ProcessInfo, ProcessStopResult

logger = logging.getLogger("toolsd.processes")

RING_BYTES = 1 << 20  # recent output in memory, at most (it grows as output comes)
# What a finished process keeps of its output in memory (older output is read from its log).
RETIRED_RING_BYTES = 64 << 10
# The logs of a session's finished processes together: past this, the oldest are removed
# (their output then reads as dropped_bytes, but for the last RETIRED_RING_BYTES).
SESSION_RETIRED_LOG_BYTES = 256 << 20
# An `until` search step costing more than this (UntilPattern.work units) runs in a worker
# thread, so the event loop keeps serving every other request.
INLINE_SEARCH_WORK = 1 << 19
# Worker threads for those and for big renderings (processes.py), at most, however many clients ask at once.
CPU_THREADS = 2
# After the command exits, how long a waiting read gives the pipe to deliver the command's
# last output before it answers (a child holding the pipe may keep it open for ever).
EXIT_DRAIN_S = 0.1
# What is kept of a command to show in process.list: its head and tail. A command may be as
# big as a frame, and a thousand of them are remembered.
COMMAND_SHOWN_CHARS = 4096


class ProcessState(States):
    """Where a background process is in its life, as its task (`watch`) sees it.

        RUNNING -> EXITED -> FINISHED -> RETIRED -> FORGOTTEN
        RUNNING | EXITED -> RETIRED      its task was cancelled (the session closed)

    EXITED: its exit was seen (`ended_at` set). FINISHED: its last output is read, or the
    drain time after the exit is over. RETIRED: ring shrunk, log sealed (see _retire).
    FORGOTTEN: dropped from the registry; the task ends and removes the log. `status` and
    `running` do not wait for EXITED: they read the Job, which knows the exit first."""

    RUNNING = "running"
    EXITED = "exited"
    FINISHED = "finished"
    RETIRED = "retired"
    FORGOTTEN = "forgotten"


_MOVES = {
    ProcessState.RUNNING: {ProcessState.EXITED, ProcessState.RETIRED},
    ProcessState.EXITED: {ProcessState.FINISHED, ProcessState.RETIRED},
    ProcessState.FINISHED: {ProcessState.RETIRED},
    ProcessState.RETIRED: {ProcessState.FORGOTTEN},
    ProcessState.FORGOTTEN: set(),
}


class BackgroundProcess:
    """One background command. Its state (ProcessState) moves only in `_move`, which sets the
    events that waiters use: `finished` on entering FINISHED or RETIRED, `_forgotten` on
    entering FORGOTTEN. `output_done` is the pipe's own: it may reach EOF before the exit.
    `stopped` is not a state but how it ended: by our signals rather than on its own."""

    def __init__(self, process_id: str, session, command: str, name: str, job,
                 log_file: CappedLog, oom_kills_before: int | None = None, input=None):
        self.id = process_id
        self.session = session
        self.command = clip(command.encode(), COMMAND_SHOWN_CHARS)[0]
        self.name = name
        self.job = job
        self.pid = job.pid
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.ring = Ring(RING_BYTES)
        self.log: CappedLog | None = log_file
        self.read_mark = 0
        self.stopped = False  # ended by process.stop / session close rather than on its own
        # Stops under way, which decide `stopped` when they end (see settled).
        self._stops = 0
        self._stops_over = trio.Event()
        self.state = ProcessState.RUNNING
        self.output_done = trio.Event()  # the pipe reached EOF (or the session ended)
        self.finished = trio.Event()  # exited, and its last output read (or drain time over)
        self._changed = trio.Event()
        # Reads waiting without a task (waiting_read.py), told of each change at once.
        self._waiters: list = []
        self._forgotten = trio.Event()
        self._oom_kills_before = oom_kills_before  # the session's, as it started
        self._cpu_samples: dict[int, tuple[psutil.Process, float, float]] = {}
        self.input = input  # a ProcessInput (terminal_input.py) for tty or stdin "pipe"

    # ------------------------------------------------------------ state

    def _move(self, to: ProcessState) -> None:
        assert to in _MOVES[self.state], f"{self.id}: {self.state} -> {to}"
        self.state = to
        if to is ProcessState.EXITED:
            self.ended_at = time.time()
        elif to in (ProcessState.FINISHED, ProcessState.RETIRED):
            self.finished.set()
        elif to is ProcessState.FORGOTTEN:
            self._forgotten.set()

    @property
    def retired(self) -> bool:
        """Finished and drained: ring shrunk, log sealed (see _retire)."""
        return self.state in (ProcessState.RETIRED, ProcessState.FORGOTTEN)

    @property
    def running(self) -> bool:
        return not self.job.has_exited

    @property
    def status(self) -> str:
        if self.running:
            return "running"
        return "stopped" if self.stopped else "exited"

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()
        if self._waiters:
            for waiter in tuple(self._waiters):  # a waiter answered leaves the list
                waiter.changed()

    def add_waiter(self, waiter) -> None:
        """`waiter.changed()` is called in the pass that changes the process (new output,
        its exit, its output's end), until `remove_waiter`."""
        self._waiters.append(waiter)

    def remove_waiter(self, waiter) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)

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
        """The process's task: pump its output until EOF and note its exit; then retire the
        process and wait until it is forgotten or its session closes, and remove its log."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._wait_exit)
                try:
                    await pump(read_fd, self.feed)
                finally:
                    self.output_done.set()
                    self._notify()
            self._retire()
            _trim_retired_logs(self.session)
            await self._forgotten.wait()
        finally:
            self._retire()
            self._drop_log()

    async def _wait_exit(self) -> None:
        await self.job.exited.wait()
        self._exit_seen()
        if self.input is not None:
            self.input.close()  # exited: it reads no more (its tree's leftovers neither)
        self._notify()
        with trio.move_on_after(EXIT_DRAIN_S):
            await self.output_done.wait()
        note = self.session.memory_note(self._oom_kills_before)
        if note:
            # In its output, where a reader (and `toolsd logs`) meets it right at the end.
            last, _, _ = self.ring.read(self.ring.end - 1, 1) if self.ring.end else (b"\n", 0, 0)
            self.feed((b"" if last == b"\n" else b"\n") + note.encode() + b"\n")
        self._move(ProcessState.FINISHED)
        self._notify()

    def _exit_seen(self) -> None:
        if self.state is ProcessState.RUNNING:
            self._move(ProcessState.EXITED)

    def _retire(self) -> None:
        """Release what a finished process no longer needs: memory beyond a short tail of its
        output, and the log's descriptors (the file stays readable until _drop_log)."""
        if self.retired:
            return
        self._move(ProcessState.RETIRED)
        if self.input is not None:
            self.input.close()
        self.output_done.set()
        if self.ended_at is None:
            self.ended_at = time.time()
        if self.log is not None:
            self.log.seal()
        self.ring.shrink(RETIRED_RING_BYTES)
        self._notify()

    def forget(self) -> None:
        """Called once the registry dropped it (retired): its task ends and removes the
        log."""
        self._move(ProcessState.FORGOTTEN)

    def _drop_log(self) -> None:
        if self.log is not None:
            remove_log(self.log, self.id)
            self.log = None

    # ------------------------------------------------------------ reading

    def read(self, since: int, limit: int) -> tuple[bytes, int, int]:
        """Bytes from `since` (at most `limit`), the offset after them, and how many bytes
        between `since` and the oldest byte still kept are gone."""
        if since >= self.ring.start or self.log is None:
            return self.ring.read(since, limit)
        try:
            return self.log.read(since, limit)
        except OSError as e:
            # Its file went away behind our back (or the disk failed): what is in memory is
            # all there is now.
            logger.warning("%s: cannot read the log (%s); keeping only the output in memory",
                           self.id, e)
            self._drop_log()
            return self.ring.read(since, limit)

    async def wait_for(self, start: int, until: UntilPattern | None) -> None:
        """Wait for output past `start` (matching `until` if given) or for the end of the
        process. Woken by each chunk of output, never by a timer; the caller bounds it.
        `until` is matched against output still in memory (the last RING_BYTES), a bounded
        piece at a time (see UntilScan), off the event loop when a piece is costly."""
        scan = UntilScan(start)
        steps = 0  # windows searched since the last wait
        while True:
            if until is None:
                if self.ring.end > start:
                    return
            else:
                window = scan.next_window(self.ring)
                if window is not None:
                    if steps:
                        # Many cheap steps in a row still take turns. Not before the first
                        # one: a match in the output that woke us is answered in this pass
                        # of the scheduler, not the next.
                        await trio.lowlevel.checkpoint()
                    steps += 1
                    if await _search(until, *window):
                        return
                    continue
            if self.finished.is_set():
                return
            steps = 0
            await self._changed.wait()

    # ------------------------------------------------------------ stopping

    async def settled(self) -> None:
        """Until no stop is under way: a process that exits in the middle of one is
        "stopped" or "exited" only once the stop knows whether its signals ended it."""
        while self._stops:
            await self._stops_over.wait()

    async def stop(self, grace_s: float) -> ProcessStopResult:
        was_running = self.running
        self._stops += 1
        try:
            ended, survivors = await end_tree(self.job, grace_s)
            # Stopped only if our signals ended something: a process that ended by itself
            # just before (or while) we looked is "exited", with its own exit code.
            if was_running and ended:
                self.stopped = True
        finally:
            self._stops -= 1
            if not self._stops:
                self._stops_over.set()
                self._stops_over = trio.Event()
        # Answer once its last output is in, so that it no longer counts as live (see start):
        # a start right after a stop finds the room the stop made.
        with trio.move_on_after(EXIT_DRAIN_S + 1):
            await self.finished.wait()
        if not self.running:
            self._exit_seen()
        return ProcessStopResult(id=self.id, status=self.status, exit_code=self.job.exit_code,
                                 signal=signal_name(self.job.signal), ended=ended,
                                 survivors=survivors)

    def info(self, shim_pid: int | None) -> ProcessInfo:
        """What `process.list` shows. cpu_percent and rss_bytes are the sums over the whole
        tree (a `bash -c` wrapper uses nothing; the server under it is what matters);
        descendants counts the processes of the tree but the command that have not ended (a
        zombie has: only its parent's wait is pending, the shim's after a stop). Blocking:
        call it from a thread, inside `self.job.holding_tree()`, which gives shim_pid."""
        cpu, rss, tree, descendants = 0.0, 0, [], 0
        if shim_pid is not None:
            tree = proctree.descendants(shim_pid)
        now = time.monotonic()
        samples = {}
        for proc in tree:
            try:
                with proc.oneshot():
                    if proc.status() == psutil.STATUS_ZOMBIE:
                        continue
                    if proc.pid != self.pid:
                        descendants += 1
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
            rss_bytes=rss, descendants=descendants,
            output_bytes=self.ring.end)


def _trim_retired_logs(session) -> None:
    """Keep the logs of a session's finished processes within SESSION_RETIRED_LOG_BYTES,
    removing the oldest first."""
    retired = [bg for bg in session.processes.values() if bg.retired and bg.log is not None]
    total = sum(bg.log.kept for bg in retired)
    for bg in retired:  # in start order
        if total <= SESSION_RETIRED_LOG_BYTES:
            break
        total -= bg.log.kept
        bg._drop_log()


def remove_log(log_file: CappedLog, owner: str) -> None:
    log_file.close()
    for path in (log_file.path, log_file.old_path):
        try:
            os.unlink(path)
        except OSError as e:
            if e.errno != errno.ENOENT:
                logger.warning("%s: cannot remove %s: %s", owner, path, e)


async def _search(until: UntilPattern, data: bytes, context: str) -> bool:
    if until.work(len(data)) <= INLINE_SEARCH_WORK:
        return until.search(data, context)
    # Abandoned at the caller's deadline: the thread finishes its bounded step on its own,
    # on its private copy of the output.
    return await trio.to_thread.run_sync(until.search, data, context, abandon_on_cancel=True,
                                         limiter=threads.limiter("until", CPU_THREADS))
