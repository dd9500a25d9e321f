"""process.output waiting for an `until` match without a task of its own
(tools.answers.Detached): the process's pump tells the read of each change, and a match is
answered right there, in the pass of trio's scheduler that read the output. A task woken to
search would answer a pass later.

Anything out of the ordinary hands the rest of the read to a task (`escalate`), which reads
as processes.output does, with the time left: the process ended or its output closed,
another reader took the output (the shared mark moved), a search or a rendering too costly
for the event loop, host_exec or the input wait needing a look, wait_s over (the read's
alarm), a `cancel` or the client gone (the connection escalates).

Its state (WaitState), with one transition function (`_move`):

    WAITING -> ANSWERED | HANDED_OVER

Resource handling: a waiting read is in its process's waiters (BackgroundProcess.add_waiter)
and has an alarm task in the session's nursery while WAITING; leaving WAITING removes it
from the waiters and ends the alarm.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Awaitable, Callable

import msgspec
import trio

from toolsd.runtime.states import States
from toolsd.tools.background_process import INLINE_SEARCH_WORK
from toolsd.tools.processes import read_start, result_now, took
from toolsd.tools.until import UntilScan, compile_until
from toolsd.wire.protocol import ProcessOutputParams, ProcessOutputResult

if TYPE_CHECKING:
    from toolsd.tools.answers import Detached
    from toolsd.tools.background_process import BackgroundProcess

__all__ = ["start"]

log = logging.getLogger("toolsd.processes")


class WaitState(States):
    WAITING = "waiting"
    ANSWERED = "answered"
    HANDED_OVER = "handed_over"


_MOVES = {
    WaitState.WAITING: {WaitState.ANSWERED, WaitState.HANDED_OVER},
    WaitState.ANSWERED: set(),
    WaitState.HANDED_OVER: set(),
}


def start(proc: BackgroundProcess, p: ProcessOutputParams, detached: Detached,
          report: Callable[[ProcessOutputResult], ProcessOutputResult | None],
          carry_on: Callable[[ProcessOutputParams], Awaitable[ProcessOutputResult]]) -> bool:
    """Wait for `p.until` without a task: True once waiting. False, having changed nothing,
    for a read that does not wait for a match (or streams), or that can be answered or must
    be handed over at once: it then runs the usual way.

    `report(result)`: `result` as the call reports it (host_exec, egress), or None when
    that needs a task. `carry_on(params)`: the read in a task, with params whose wait_s is
    the time left."""
    if p.until is None or not p.wait_s > 0 or p.stream:
        return False
    try:
        until = compile_until(p.until)
    except ValueError:
        return False  # the usual way says what is wrong
    read = _WaitingRead(proc, p, until, report)
    if read.check() is not None:
        return False  # found already, or not for the event loop: a task sees to it at once

    async def rest() -> ProcessOutputResult:
        read.hand_over()  # gone from the waiters, if a cancel or the connection's end came first
        left = max(0.0, read.deadline - trio.current_time())
        return await carry_on(msgspec.structs.replace(p, wait_s=left))

    detached.rest = rest
    read.detached = detached
    proc.add_waiter(read)
    proc.session.start_soon(read.alarm)
    return True


class _WaitingRead:
    """One waiting read (see the module's docstring)."""

    def __init__(self, proc: BackgroundProcess, p: ProcessOutputParams, until,
                 report: Callable[[ProcessOutputResult], ProcessOutputResult | None]):
        self.proc = proc
        self.p = p
        self.until = until
        self.report = report
        self.start = read_start(proc, p)
        self.scan = UntilScan(self.start)
        self.deadline = trio.current_time() + p.wait_s
        self.state = WaitState.WAITING
        self.detached: Detached | None = None
        self._alarm = trio.CancelScope(deadline=self.deadline)

    def _move(self, to: WaitState) -> None:
        assert to in _MOVES[self.state], f"waiting read: {self.state} -> {to}"
        self.state = to
        self.proc.remove_waiter(self)
        self._alarm.cancel()

    async def alarm(self) -> None:
        """wait_s is over: a task answers with what came."""
        with self._alarm:
            await trio.sleep_forever()
        self.hand_over()

    def hand_over(self) -> None:
        """The rest goes to a task (or is there already): once only."""
        if self.state is WaitState.WAITING:
            self._move(WaitState.HANDED_OVER)
            self.detached.escalate()

    def changed(self) -> None:
        """The process changed (output, exit, end of its output), in the pass that saw it:
        answer a match, hand over what is not for the event loop, or wait on."""
        if self.state is not WaitState.WAITING:
            return
        if not self.detached.can_finish:
            self.hand_over()  # a cancel, or the connection's end: the task is on its way
            return
        try:
            found = self.check()
            if found and self._answer():
                return
        except Exception:
            log.exception("%s: a waiting read failed; a task takes it over", self.proc.id)
            found = False
        if found is not None:
            self.hand_over()

    def check(self) -> bool | None:
        """True if the output since the read's start matches, False if the read is not for
        the event loop any more; None to wait on."""
        proc, p = self.proc, self.p
        if proc.output_done.is_set() or not proc.running or (
                p.since is None and proc.read_mark > self.start):
            return False
        window = self.scan.next_window(proc.ring)
        if window is None:
            return None
        data, context = window
        if self.until.work(len(data)) > INLINE_SEARCH_WORK:
            return False
        if self.until.search(data, context):
            return True
        # More than one window in a row (a flood, or a long backlog at the start): a task
        # searches on, taking turns with the other tasks between windows.
        return False if proc.ring.end > self.scan.scanned else None

    def _answer(self) -> bool:
        """Answer the match now, if everything of the answer is at hand; False, having
        changed nothing, if not."""
        found = result_now(self.proc, self.p, self.start)
        result = self.report(found) if found is not None else None
        if result is None:
            return False
        took(self.proc, self.p, result)
        # The answer goes out first: what leaving WAITING does (the alarm's cancel, above
        # all) is none of the caller's wait.
        self.detached.finish(result)
        self._move(WaitState.ANSWERED)
        return True
