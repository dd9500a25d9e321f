"""Background processes: `bgN` ids that are never reused, output kept for reading while they
run, and a stop that ends the whole tree.

Resource handling: a BackgroundProcess belongs to its session; its output pump runs in the
session's nursery. `stop()` ends every process of its tree (through its shim, which every
orphan reparents to); session close and daemon shutdown call it for each one still running.
"""

from __future__ import annotations

import os
import re
import time

import psutil
import trio

from . import proctree
from .output import CappedLog, Ring, render
from .protocol import (
    BAD_PARAMS,
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

RING_BYTES = 1 << 20  # recent output in memory
LOG_CAP_BYTES = 64 << 20  # older output on disk, per process


class BackgroundProcess:
    def __init__(self, process_id: str, session, command: str, name: str, job, log: CappedLog):
        self.id = process_id
        self.session = session
        self.command = command
        self.name = name
        self.job = job
        self.pid = job.pid
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.ring = Ring(RING_BYTES)
        self.log = log
        self.read_mark = 0
        self.stopped = False  # ended by process.stop / session close rather than on its own
        self.output_done = trio.Event()
        self._changed = trio.Event()

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
        self.log.append(data)
        self._notify()

    async def watch(self, read_fd: int) -> None:
        """The process's task: pump its output until EOF, note its exit."""
        async with trio.open_nursery() as nursery:
            async def wait_exit():
                await self.job.exited.wait()
                self.ended_at = time.time()
                self._notify()

            nursery.start_soon(wait_exit)
            try:
                await pump(read_fd, self.feed)
            finally:
                self.output_done.set()
                self._notify()

    # ------------------------------------------------------------ reading

    def read(self, since: int, limit: int) -> tuple[bytes, int, int]:
        """Bytes from `since` (at most `limit`), the offset after them, and how many bytes
        between `since` and the oldest byte still kept are gone."""
        if since >= self.ring.start:
            return self.ring.read(since, limit)
        return self.log.read(since, limit)

    async def wait_for(self, start: int, wait_s: float, until: re.Pattern | None) -> None:
        """Wait up to wait_s for output past `start` (matching `until` if given) or for the end
        of the process's output."""
        with trio.move_on_after(wait_s):
            while True:
                if self.output_done.is_set():
                    return
                if until is None:
                    if self.ring.end > start:
                        return
                else:
                    data, _, _ = self.read(start, self.ring.end - start)
                    if until.search(render(data)):
                        return
                changed = self._changed
                await changed.wait()

    # ------------------------------------------------------------ stopping

    async def stop(self, grace_s: float) -> ProcessStopResult:
        was_running = self.running
        ended, survivors = await trio.to_thread.run_sync(
            lambda: proctree.kill_tree(self.job.shim_pid, grace_s=grace_s, include_root=False))
        if was_running or ended:
            self.stopped = self.stopped or was_running
        with trio.move_on_after(5):
            await self.job.exited.wait()
        if self.ended_at is None and not self.running:
            self.ended_at = time.time()
        return ProcessStopResult(id=self.id, status=self.status, exit_code=self.job.exit_code,
                                 signal=signal_name(self.job.signal), ended=ended,
                                 survivors=survivors)

    def info(self) -> ProcessInfo:
        cpu, rss, descendants = 0.0, 0, 0
        try:
            tree = proctree.descendants(self.job.shim_pid)
            descendants = max(0, len(tree) - (1 if self.running else 0))
            if self.running:
                main = psutil.Process(self.pid)
                with main.oneshot():
                    cpu = main.cpu_percent(interval=None)
                    rss = main.memory_info().rss
        except psutil.Error:
            pass
        return ProcessInfo(
            id=self.id, session=self.session.id, name=self.name, command=self.command,
            pid=self.pid, status=self.status, exit_code=self.job.exit_code,
            started_at=self.started_at, ended_at=self.ended_at, cpu_percent=cpu,
            rss_bytes=rss, descendants=descendants, output_bytes=self.ring.end)


# ---------------------------------------------------------------- methods


async def start(supervisor, session, p: ProcessStartParams) -> ProcessStartResult:
    session.check_open()
    if not p.command.strip():
        raise ToolsdError(BAD_PARAMS, "process.start: command is empty; give the command to run")
    cwd = session.resolve_cwd(p.cwd)
    env = session.command_env(p.env)
    _shell_name, shell_path = session.shell
    process_id = f"bg{supervisor.state.next_id('process')}"
    job, read_fd = await spawn_with_pipe(session, [shell_path, "-c", p.command], cwd=cwd, env=env)
    log = CappedLog(os.path.join(supervisor.state.logs, f"{process_id}.log"), LOG_CAP_BYTES)
    proc = BackgroundProcess(process_id, session, p.command, p.name, job, log)
    supervisor.processes[process_id] = proc
    session.processes[process_id] = proc
    session.nursery.start_soon(proc.watch, read_fd)
    return ProcessStartResult(id=process_id, pid=job.pid)


async def output(proc: BackgroundProcess, p: ProcessOutputParams) -> ProcessOutputResult:
    until = None
    if p.until is not None:
        try:
            until = re.compile(p.until)
        except re.error as e:
            raise ToolsdError(BAD_PARAMS, f"process.output: until is not a valid regular "
                              f"expression ({e})") from None
    start = proc.read_mark if p.since is None else p.since
    if p.wait_s > 0:
        await proc.wait_for(start, p.wait_s, until)
    end = proc.ring.end
    text, truncated, dropped = read_range(proc, start, end, p.max_output_chars)
    if p.since is None:
        proc.read_mark = max(proc.read_mark, end)
    return ProcessOutputResult(
        id=proc.id, status=proc.status, exit_code=proc.job.exit_code,
        signal=signal_name(proc.job.signal), output=text, next=end,
        dropped_bytes=dropped, truncated=truncated)


def read_range(proc: BackgroundProcess, start: int, end: int, max_chars: int):
    """The output between `start` and `end` as text: all of it when it fits, else its head and
    its tail around one marker line that says how to read the rest."""
    if start >= end:
        return "", False, 0
    size = end - start
    if size <= max_chars:
        data, _next, dropped = proc.read(start, size)
        return render(data), False, dropped
    half = max(0, max_chars // 2 - 60)
    head, head_next, dropped = proc.read(start, half)
    tail, _next, _ = proc.read(end - half, half)
    left_out = (end - half) - head_next
    marker = f"\n[... {left_out} bytes left out; process.output with since={head_next} reads them ...]\n"
    text = render(head) + marker + render(tail)
    return text[:max_chars] if len(text) > max_chars else text, True, dropped


async def stop(proc: BackgroundProcess, p) -> ProcessStopResult:
    return await proc.stop(p.grace_s)


async def listing(supervisor, p) -> ProcessListResult:
    procs = [bg for bg in supervisor.processes.values()
             if p.session is None or bg.session.id == p.session]
    infos = await trio.to_thread.run_sync(lambda: [bg.info() for bg in procs])
    return ProcessListResult(processes=infos)
