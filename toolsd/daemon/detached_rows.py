"""The starters of the rows that can run without a task of their own (`Method.detached` in
dispatch.py): repl.exec on an idle interpreter, and process.output waiting for an `until`
match. Each is tried in the task that read the request; False, having changed nothing,
runs the request the usual way (tools.answers.Detached says how the rest goes)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import trio

from toolsd.tools import processes, repl, waiting_read
from toolsd.wire.protocol import ProcessOutputParams, ProcessOutputResult, ReplExecParams

if TYPE_CHECKING:
    from toolsd.daemon.session import Session
    from toolsd.daemon.supervisor import Supervisor
    from toolsd.tools.answers import Detached
    from toolsd.tools.background_process import BackgroundProcess

__all__ = ["repl_exec", "process_output", "with_egress"]


def repl_exec(sup: Supervisor, p: ReplExecParams, detached: Detached) -> bool:
    session = sup.session(p.session)
    return _as_activity(session, detached, lambda: repl.start_detached(session, p, detached))


def process_output(sup: Supervisor, p: ProcessOutputParams, detached: Detached) -> bool:
    proc = sup.processes.get(p.id, p.session)
    session = proc.session

    def report(result: ProcessOutputResult) -> ProcessOutputResult | None:
        host_exec = session.repositories.look_now()  # first, as in Method.call_now
        if host_exec is None:
            return None
        return session.reported_as(with_egress(proc, p, result), host_exec)

    async def carry_on(q: ProcessOutputParams) -> ProcessOutputResult:
        return await session.reported(with_egress(proc, q, await processes.output(proc, q)))

    return _as_activity(session, detached,
                        lambda: waiting_read.start(proc, p, detached, report, carry_on))


def with_egress(proc: BackgroundProcess, p: ProcessOutputParams,
                result: ProcessOutputResult) -> ProcessOutputResult:
    """A process.output `result` with the connections its session was refused (egress)."""
    proc.session.net.report_output(result, proc, moves_mark=p.since is None)
    return result


def _as_activity(session: Session, detached: Detached, start: Callable[[], bool]) -> bool:
    """`start()` a request without a task on `session`: True if it took it. The call is the
    session's activity until it is answered, by whoever answers it. Not taken, the request
    runs the usual way (under session.call), and its Detached with this hook is dropped."""
    def end() -> None:
        session.activity.end(trio.current_time())

    session.activity.begin()
    detached.after(end)
    try:
        started = start()
    except BaseException:
        end()
        raise
    if not started:
        end()
    return started
