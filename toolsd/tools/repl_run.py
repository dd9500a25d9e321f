"""One repl.exec from the moment it has its REPL's lock (repl.py's): its output, its deadline,
its result, and its end, in a task or, without one, on its sentinel.

Its state (RunState), with one transition function (`Run._move`):

    BEGUN -> DETACHED | TASK
    DETACHED -> TASK | ANSWERED
    TASK -> ANSWERED            (final: entering it gives the REPL's lock back, Repl.end_run)

- BEGUN: its code is on its way to the interpreter (Repl._begin).
- DETACHED: no task waits for it (Repl.start_detached): the interpreter's pump tells it of
  its sentinel (`sentinel_came`), or its watch hands it to a task (`needs_task`: deadline,
  output closed, exit, kill); the connection can hand it to one too (`cancel`, closing).
- TASK: a task runs `finish()`: Repl.execute's own, or the one a Detached escalated to.
- ANSWERED: `finish()` returned or raised, or its sentinel was answered without a task.
docs/sequences.md draws every way out of DETACHED.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import msgspec
import trio

from toolsd.runtime import threads
from toolsd.runtime.states import States
from toolsd.sandbox.launch import proctree
from toolsd.sandbox.launch.launcher_client import KILL_THREADS
from toolsd.tools.live_output import LiveOutput, sending
from toolsd.tools.output import HeadTail
from toolsd.tools.sentinel import Sentinel
from toolsd.tools.shell import KILL_GRACE_S
from toolsd.tools.spill import tee
from toolsd.wire.protocol import ReplExecParams, ReplExecResult, ReplImage

if TYPE_CHECKING:
    from toolsd.tools.answers import Answer, Detached
    from toolsd.tools.interpreter import Interpreter
    from toolsd.tools.repl import Repl
    from toolsd.tools.session_view import SessionView

class RunState(States):
    BEGUN = "begun"
    DETACHED = "detached"
    TASK = "task"
    ANSWERED = "answered"


_MOVES = {
    RunState.BEGUN: {RunState.DETACHED, RunState.TASK},
    RunState.DETACHED: {RunState.TASK, RunState.ANSWERED},
    RunState.TASK: {RunState.ANSWERED},
    RunState.ANSWERED: set(),
}


class Run:
    """One repl.exec from the moment it has its REPL's lock: its output, its deadline and its
    result. It owns the lock until it is ANSWERED (see the module's docstring)."""

    def __init__(self, repl: Repl, interp: Interpreter, p: ReplExecParams, fresh: bool,
                 started: float, answer: Answer | None = None):
        self.repl = repl
        self.interp = interp
        self.p = p
        self.fresh = fresh
        self.started = started
        self.line = msgspec.json.encode(p.code) + b"\n"
        self.out = HeadTail(p.max_output_chars)
        self.spill = repl.spills.start(p.max_output_chars) if p.spill and repl.spills else None
        self.feed = self.out.feed if self.spill is None else tee(self.out.feed, self.spill.feed)
        # Only with a task of its own (Repl.start_detached leaves a streaming request alone).
        self.live = LiveOutput(answer.emit) if p.stream and answer is not None else None
        if self.live is not None:
            self.feed = tee(self.feed, self.live.feed)
        self.late_dropped = repl.take_late(self.feed)
        self.deadline = trio.current_time() + p.timeout_s
        self.state = RunState.BEGUN
        self.detached: Detached | None = None  # for a request without a task
        # Before its code goes out: what starts after this is the request's (proctree).
        self.since = proctree.mark()
        # The interpreter before this fresh one died without an answer saying so.
        self.lost_before = False
        self.session: SessionView | None = None  # for a request without a task: its report

    def result(self, status: str, state_lost: bool = False, notice: str = "",
               processes_ended: int = 0) -> ReplExecResult:
        # The output within max_output_chars, the notice line (if any, and if it fits) last.
        output, truncated = self.out.result_with(notice)
        if state_lost:
            self.interp.loss_told = True
        state_lost = state_lost or self.lost_before
        return ReplExecResult(
            status=status,
            output=output,
            output_bytes=self.out.total + self.late_dropped,
            truncated=truncated or self.late_dropped > 0,
            fresh=self.fresh,
            state_lost=state_lost,
            duration_s=round(time.monotonic() - self.started, 6),
            images=_images(self.interp.sentinel),
            output_file=self.spill.finish(truncated) if self.spill is not None else None,
            processes_ended=processes_ended,
        )

    async def in_tree(self, fn, *args, **kwargs):
        """fn(shim, interpreter, since, ...) on this request's processes, in a worker thread
        (it reads /proc), with the shim held so that its pid stays the shim's; None once the
        interpreter's tree is gone."""
        job = self.interp.job
        with job.holding_tree() as shim_pid:
            if shim_pid is None:
                return None
            return await trio.to_thread.run_sync(
                lambda: fn(shim_pid, job.pid, self.since, *args, **kwargs),
                limiter=threads.limiter("kill", KILL_THREADS))

    async def end_processes(self, signalled: frozenset) -> int:
        """End what the request started that still runs, as shell.run ends a command's tree
        on timeout; how many of its processes ended, those `signalled` before included."""
        done = await self.in_tree(proctree.end_since, grace_s=KILL_GRACE_S,
                                  interrupted=signalled or frozenset())
        return done[0] if done else 0

    def _move(self, to: RunState) -> None:
        assert to in _MOVES[self.state], f"repl.exec run: {self.state} -> {to}"
        self.state = to
        if to is RunState.ANSWERED:
            self.repl.end_run(self)

    def detach(self, detached: Detached) -> None:
        """It has no task: `detached` answers it, or hands it to one."""
        self.detached = detached
        self._move(RunState.DETACHED)

    def release(self) -> None:
        """The interpreter's pump must read on without waiting for a streaming client."""
        if self.live is not None:
            self.live.release()

    async def finish(self) -> ReplExecResult:
        """The rest of the request, in a task."""
        async with sending(self.live):
            result, notice = await self._finish()
            if self.live is not None:
                # The rest of the stream needs the client, not the interpreter: the next
                # request on it need not wait for a slow reader.
                await self.live.finish(notice)
        return result

    async def _finish(self) -> tuple[ReplExecResult, str]:
        self._move(RunState.TASK)
        if self.interp.waiter is self:
            self.interp.waiter = None
        try:
            status, state_lost, notice, *details = await self.repl.carry_out(self)
            if state_lost and self.repl.cut_off:
                # Its interpreter was killed by the session's close, not by the code.
                raise self.repl.ended()
            return self.result(status, state_lost, notice, *details), notice
        finally:
            self.release()
            self._move(RunState.ANSWERED)
            if self.spill is not None:
                self.spill.discard()  # a no-op once its result has it

    # Called by the interpreter, for a request without a task.

    def sentinel_came(self, ok: bool) -> None:
        host_exec = self.session.repositories.look_now()
        if host_exec is None:
            # The code changed the workspace so that looking at it takes a worker thread,
            # which the request's task (rest) waits for. It finds the sentinel there.
            self.needs_task()
            return
        # All that a task's answer reports (session.reported): host_exec, and the connections
        # the sandbox was refused during the call.
        result = self.session.reported_as(self.result("ok" if ok else "error"), host_exec)
        if self.detached.finish(result):
            self._move(RunState.ANSWERED)
        # else a task has the request: it finds the sentinel

    def needs_task(self) -> None:
        """Its deadline passed, or the interpreter is gone: a task takes it (TASK once that
        task runs `finish`)."""
        self.detached.escalate()


def _images(sentinel: Sentinel | None) -> list[ReplImage]:
    """The pictures the driver listed with the request's sentinel (1.1 "figures"). Code in
    the sandbox could forge a sentinel: a list of any other shape is dropped, not passed on."""
    listed = sentinel.status.get("images") if sentinel is not None else None
    if not listed:
        return []
    try:
        return msgspec.convert(listed, list[ReplImage])
    except msgspec.ValidationError:
        return []

