"""One REPL driver process (repl.py's): its pipes, the framing of its output by sentinels,
its pump and watch tasks, interrupts, and its end."""

from __future__ import annotations

import functools
import math
import os
import signal
import uuid as uuidlib
from typing import TYPE_CHECKING

import trio

from toolsd.runtime.child_fds import ChildFds
from toolsd.runtime.states import States
from toolsd.sandbox.launch.spawning import end_tree, pump, signal_name, spawn_with_pipe
from toolsd.tools.sentinel import Sentinel, SentinelScanner

if TYPE_CHECKING:
    from toolsd.tools.repl_priority import StartPriority
    from toolsd.tools.repl_run import Run

# At most this many interpreters are starting at once, across every session (the daemon's
# Host.interpreter_starts): a start is tens of milliseconds of CPU, and a burst of them (a
# thousand turns beginning at once) would otherwise take every core from the calls of the
# sessions already running. One core's worth at least stays theirs.
STARTS_AT_ONCE = max(1, (os.cpu_count() or 1) - 1)
# A start holds its place until the driver has answered an empty first request (it has
# started and reads requests), for at most this long: a start that waits (a sitecustomize
# sleeping, a stopped interpreter) is not using the CPU the bound is for, and must not hold
# up the starts of other sessions.
START_SLOT_S = 2.0
WARM_UP = b'""\n'  # the empty first request, as the driver reads it: a JSON string

# After the interpreter exits without a sentinel, how long we read the rest of its output
# (the sentinel may still be in the pipe) before killing whatever holds the pipe open.
DRAIN_S = 0.5


# Sent to the driver after an interrupt request is written to its fd 4. Not SIGINT (see the
# module's docstring); its default action is to do nothing, so it harms no process that has
# no handler for it (node's driver reads fd 4 in a thread of its own and needs none).
WAKE_SIGNAL = signal.SIGURG


class Sending(States):
    """How much of the request in flight the command pipe has taken. Only ALL numbers the
    request: the driver counts the lines it received.

        ALL -> NONE          a request begins (ALL at start: nothing to send)
        NONE -> NONE         another begins; the last was cancelled before its first byte
        NONE -> SOME | ALL   the pipe takes part of it, or all
        SOME -> ALL
    """

    NONE = "none"
    SOME = "some"
    ALL = "all"


_SENDING_MOVES = {
    Sending.ALL: {Sending.NONE},
    Sending.NONE: {Sending.NONE, Sending.SOME, Sending.ALL},
    Sending.SOME: {Sending.ALL},
}


class Life(States):
    """Whether the interpreter can still answer: anything but RUNNING makes it `gone`, and so
    does its exit, read from its Job (not copied here: that would wait for the watch task).

        RUNNING -> OUTPUT_CLOSED     its output reached EOF
        RUNNING | OUTPUT_CLOSED -> KILLING -> KILLED
    """

    RUNNING = "running"
    OUTPUT_CLOSED = "output closed"
    KILLING = "killing"
    KILLED = "killed"


_LIFE_MOVES = {
    Life.RUNNING: {Life.OUTPUT_CLOSED, Life.KILLING},
    Life.OUTPUT_CLOSED: {Life.KILLING},
    Life.KILLING: {Life.KILLED},
    Life.KILLED: set(),
}


class Interpreter:
    """One driver process: its job, the command and interrupt pipes, the framing state, the
    pump task, and the watch task (its exit, and the deadline of a request without a task).

    Two states, each with its one move: `sent` (Sending) for the request in flight, `life`
    (Life) for the interpreter. `_killed` is set on entering KILLED; `eof` whenever the output
    ends, killed or not (kill waits for it)."""

    def __init__(self, job, cmd_fd: int, intr_fd: int, idle_sink):
        self.job = job
        self.uuid = uuidlib.uuid4().hex
        self.scanner = SentinelScanner(self.uuid)
        self.seq = 0
        self.sentinel: Sentinel | None = None
        self.sent = Sending.ALL
        self.life = Life.RUNNING
        self.eof = trio.Event()
        # The request in flight if no task waits for it (a Run): told of its sentinel, or
        # handed to a task when its deadline passes or the interpreter goes.
        self.waiter: Run | None = None
        # An answer said `state_lost: true` for this interpreter (else the next call does).
        self.loss_told = False
        self._cmd_fd = cmd_fd
        self._intr_fd = intr_fd
        self._unsent = b""  # of the request in flight
        self._next_sink = idle_sink  # its output's, once all of it is sent
        self._idle_sink = idle_sink
        self._sink = idle_sink
        # The wait of a streaming request's sink for room (tools/live_output.py), as for the sink.
        self._next_room = None
        self._room = None
        self._wake = trio.Event()
        self._alarm = trio.CancelScope()  # the watch task's wait (see _watch)
        self._alarm_at = math.inf
        self._pump_scope = trio.CancelScope()
        self._killed = trio.Event()
        self.out_of_memory = lambda: False  # see start
        self.memory_mb = 0

    @classmethod
    async def start(cls, session, argv: list[str], idle_sink) -> Interpreter:
        oom_kills = session.oom_kills()
        with ChildFds() as fds:  # the interpreter holds the only copies: EPIPE at its exit
            cmd_r, cmd_w = fds.pipe_in()
            intr_r, intr_w = fds.pipe_in(os.O_NONBLOCK)
            # Its shim resumes it whenever it stops (the session's code may stop it: `kill
            # -STOP -1`), so that a request never reaches it stopped, to time out and be
            # killed, losing its state.
            job, read_fd = await spawn_with_pipe(session.sandbox, argv, cwd=session.workspace,
                                                 env=session.env, extra_fds=[cmd_r, intr_r],
                                                 resume_stopped=True)
        self = cls(job, cmd_w, intr_w, idle_sink)
        # Whether the session met its memory limit while this interpreter lived.
        self.out_of_memory = functools.partial(session.memory_limit_hit, oom_kills)
        self.memory_mb = session.limits.memory_mb
        os.set_blocking(cmd_w, False)
        session.nursery.start_soon(self._pump, read_fd)
        session.nursery.start_soon(self._watch)
        try:
            # Into an empty pipe, and shorter than PIPE_BUF: all of it, at once.
            os.write(cmd_w, self.uuid.encode() + b"\n")
        except OSError:
            pass  # it died at once: the first request finds it gone
        return self

    async def warm_up(self, priority: StartPriority, within: float = START_SLOT_S) -> None:
        """Send the empty first request and wait (at most `within` seconds) for its answer,
        when the driver has started, at the lower priority of a start for part of it
        (repl_priority.py). Whatever the start printed (a sitecustomize's output) comes at
        the start of the next request's output, as anything printed between requests; a
        request begun before the answer came has the next number, and the scanner drops the
        lower one's sentinel."""
        self.begin(WARM_UP, self._idle_sink)
        with trio.move_on_after(within):
            await priority.while_starting(self.job.pid, self.settled)

    @property
    def gone(self) -> bool:
        """The interpreter exited, or closed its output (it can answer nothing more)."""
        return self.life is not Life.RUNNING or self.job.has_exited

    def _move(self, to: Life) -> None:
        assert to in _LIFE_MOVES[self.life], f"interpreter: {self.life} -> {to}"
        self.life = to
        if to is Life.KILLED:
            self._killed.set()

    def _send_move(self, to: Sending) -> None:
        assert to in _SENDING_MOVES[self.sent], f"request: {self.sent} -> {to}"
        self.sent = to

    def how_it_ended(self) -> str:
        if self.job.lost:
            return "the sandbox's launcher went away"
        if self.job.signal is not None and self.out_of_memory():
            return (f"killed by {signal_name(self.job.signal)}: the session's memory limit "
                    f"({self.memory_mb} MB) was reached, and the kernel's OOM killer ended it")
        if self.job.signal is not None:
            return f"killed by {signal_name(self.job.signal)}"
        if self.job.exit_code is not None:
            return f"exit code {self.job.exit_code}"
        return "it closed its output"

    # ------------------------------------------------------------ requests

    def begin(self, line: bytes, sink, room=None) -> None:
        """Send one request, as much of it as the pipe takes now (`sent`; send_rest sends
        the rest). Its output goes to `sink` until its sentinel; `room()`, if given, holds
        the pump while the sink cannot take more."""
        self.sentinel = None
        self._wake = trio.Event()
        self._send_move(Sending.NONE)
        self._unsent = line
        self._next_sink = sink
        self._next_room = room
        self._write_some()

    async def send_rest(self) -> None:
        """The rest of the request begun, waiting for room in the pipe."""
        while self._write_some() is False:
            try:
                await trio.lowlevel.wait_writable(self._cmd_fd)
            except trio.ClosedResourceError:
                return  # killed meanwhile

    def _write_some(self) -> bool | None:
        """True once all of the request is sent; False if the pipe is full; None if it
        cannot be sent (the interpreter is gone, or killed: settled() sees it)."""
        while self._unsent:
            if self._cmd_fd < 0:
                return None
            try:
                n = os.write(self._cmd_fd, self._unsent)
            except BlockingIOError:
                return False
            except OSError:
                return None  # EPIPE
            self._unsent = self._unsent[n:]
            if self._unsent and self.sent is Sending.NONE:
                self._send_move(Sending.SOME)
        if self.sent is not Sending.ALL:
            # Only now is the request numbered: the driver counts the lines it received, so
            # a request cancelled before its first byte went out must not take a number. The
            # driver cannot answer a request before reading all of it.
            self._send_move(Sending.ALL)
            self.seq += 1
            self.scanner.expect(self.seq)
            self._sink = self._next_sink
            self._room = self._next_room
        return True

    def wait_detached(self, run: Run) -> None:
        """`run` has no task: tell it of its sentinel, or hand it to one when its deadline
        passes or the interpreter goes."""
        self.waiter = run
        if run.deadline < self._alarm_at:
            # Only when it comes sooner: requests with the same timeout never move the alarm,
            # which goes off once per timeout at most and is set again for the request then
            # in flight.
            self._alarm_at = self._alarm.deadline = run.deadline

    def _hand_over(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None:
            waiter.needs_task()

    async def settled(self) -> None:
        """Until the request in flight is answered or the interpreter is gone."""
        while self.sentinel is None and not self.gone:
            await self._wake.wait()
            self._wake = trio.Event()

    def interrupt(self) -> None:
        """Ask the driver to interrupt the request in flight (all of it sent): its number on
        the interrupt pipe, then the wake-up. The driver ignores it if that request has
        ended meanwhile."""
        try:
            os.write(self._intr_fd, b"%d\n" % self.seq)
        except OSError:
            pass  # gone (it is then killed), or a driver that reads no interrupts: full
        self._signal(signal.SIGCONT)
        self._signal(WAKE_SIGNAL)

    def _signal(self, sig: int) -> None:
        """Signal the interpreter while it runs. SIGCONT with an interrupt: its shim resumes
        it when it stops (see start), but a shim stopped too hears of it only once the
        launcher has resumed the shim; an interrupt is rare enough to make sure."""
        if self.job.pid > 0 and not self.job.has_exited:
            try:
                os.kill(self.job.pid, sig)
            except ProcessLookupError:
                pass

    async def drain(self) -> None:
        """The interpreter is gone: read the rest of its output, killing whatever it left
        holding the pipe if the rest does not come soon."""
        with trio.move_on_after(DRAIN_S):
            await self.eof.wait()
        if not self.eof.is_set():
            await self.kill()

    # ------------------------------------------------------------ output

    async def _pump(self, read_fd: int) -> None:
        try:
            with self._pump_scope:
                await pump(read_fd, self._on_data, self._wait_room)
        finally:
            rest = self.scanner.flush()
            if rest:
                self._sink(rest)
            self.eof.set()
            if self.life is Life.RUNNING:
                self._move(Life.OUTPUT_CLOSED)
            self._wake.set()
            self._hand_over()

    async def _wait_room(self) -> None:
        room = self._room
        if room is not None:
            await room()

    def _on_data(self, data: bytes) -> None:
        while True:
            out, sentinel = self.scanner.feed(data)
            if out:
                self._sink(out)
            if sentinel is None:
                return
            # Set synchronously with the sentinel: whatever follows it is late output.
            self.sentinel = sentinel
            self._sink = self._idle_sink
            self._room = None
            self._wake.set()
            waiter, self.waiter = self.waiter, None
            if waiter is not None:
                waiter.sentinel_came(sentinel.ok)
            if not self.scanner.holding:
                return  # the usual case: nothing came after the sentinel
            data = b""

    async def _watch(self) -> None:
        """Until the interpreter exits: then wake whoever waits for it. Meanwhile, hand a
        request without a task whose deadline passed to a task, which interrupts it."""
        while not self.job.exited.is_set():
            self._alarm = trio.CancelScope(deadline=self._alarm_at)
            with self._alarm:
                await self.job.exited.wait()
            waiter = self.waiter
            if waiter is not None and trio.current_time() >= waiter.deadline:
                self._hand_over()
            self._alarm_at = self.waiter.deadline if self.waiter is not None else math.inf
        self._wake.set()
        self._hand_over()

    # ------------------------------------------------------------ ending

    async def kill(self) -> int:
        """End the interpreter's whole tree and its pump; idempotent, shielded. How many
        processes of its tree other than the interpreter this call ended."""
        with trio.CancelScope(shield=True):
            if self.life in (Life.KILLING, Life.KILLED):
                await self._killed.wait()
                return 0
            self._move(Life.KILLING)
            self._wake.set()
            self._hand_over()
            try:
                fd, self._cmd_fd = self._cmd_fd, -1
                trio.lowlevel.notify_closing(fd)
                os.close(fd)
                fd, self._intr_fd = self._intr_fd, -1
                os.close(fd)
                running = int(not self.job.has_exited)
                ended, _survivors = await end_tree(self.job, 0)
                # Every writer is dead: the pipe's rest is there to read at once, unless a
                # descriptor escaped the tree; then we stop reading anyway.
                with trio.move_on_after(DRAIN_S):
                    await self.eof.wait()
                self._pump_scope.cancel()
                return max(0, ended - running)
            finally:
                self._move(Life.KILLED)
