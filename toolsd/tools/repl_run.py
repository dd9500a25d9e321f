"""One repl.exec from the moment it has its REPL's lock (repl.py's): its output, its deadline,
its result, and its end, in a task or, without one, on its sentinel."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import msgspec
import trio

from toolsd.runtime import threads
from toolsd.sandbox import proctree
from toolsd.sandbox.launcher import KILL_THREADS
from toolsd.tools.output import HeadTail
from toolsd.tools.sentinel import Sentinel
from toolsd.tools.shell import KILL_GRACE_S
from toolsd.tools.spill import tee
from toolsd.wire.protocol import UNSET, ReplExecParams, ReplExecResult, ReplImage

if TYPE_CHECKING:
    from toolsd.tools.calls import Detached
    from toolsd.tools.interpreter import Interpreter
    from toolsd.tools.repl import Repl

class Run:
    """One repl.exec from the moment it has its REPL's lock: its output, its deadline and its
    result. The lock is released by whatever ends it: `finish()` in a task, or, for a request
    without one (start_detached), the sentinel's arrival."""

    def __init__(self, repl: Repl, interp: Interpreter, p: ReplExecParams, fresh: bool,
                 started: float):
        self.repl = repl
        self.interp = interp
        self.p = p
        self.fresh = fresh
        self.started = started
        self.line = msgspec.json.encode(p.code) + b"\n"
        self.out = HeadTail(p.max_output_chars)
        self.spill = repl.spills.start(p.max_output_chars) if p.spill and repl.spills else None
        self.feed = self.out.feed if self.spill is None else tee(self.out.feed, self.spill.feed)
        self.late_dropped = repl._take_late(self.feed)
        self.deadline = trio.current_time() + p.timeout_s
        self.detached: Detached | None = None  # for a request without a task
        # Before its code goes out: what starts after this is the request's (proctree).
        self.since = proctree.mark()
        # The interpreter before this fresh one died without an answer saying so.
        self.lost_before = False
        self.host_exec_now = None  # RepositoryWatch.look_now, for a request without a task

    def result(self, status: str, state_lost: bool = False, notice: str = "",
               processes_ended: int = 0) -> ReplExecResult:
        output, truncated = _render(self.out, notice)
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

    async def finish(self) -> ReplExecResult:
        """The rest of the request, in a task."""
        if self.interp.waiter is self:
            self.interp.waiter = None
        try:
            status, state_lost, *details = await self.repl._run(self)
            if state_lost and self.repl._cut_off is not None:
                # Its interpreter was killed by the session's close, not by the code.
                raise self.repl.ended()
            return self.result(status, state_lost, *details)
        finally:
            self.repl._lock.release()
            if self.spill is not None:
                self.spill.discard()  # a no-op once its result has it

    # Called by the interpreter, for a request without a task.

    def sentinel_came(self, ok: bool) -> None:
        host_exec = self.host_exec_now()
        if host_exec is None:
            # The code changed the workspace so that looking at it takes a worker thread,
            # which the request's task (rest) waits for. It finds the sentinel there.
            self.needs_task()
            return
        result = self.result("ok" if ok else "error")
        result.host_exec = host_exec or UNSET
        if self.detached.finish(result):
            self.repl._lock.release()
        # else a task has the request: it finds the sentinel

    def needs_task(self) -> None:
        """Its deadline passed, or the interpreter is gone."""
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


def _render(out: HeadTail, notice: str) -> tuple[str, bool]:
    """The output within max_output_chars, the notice line (if any, and if it fits) last."""
    return out.result_with(notice)
