"""The table the connection dispatches with: one row per wire method (`Method`), and its
handler.

Every handler has one signature, `(target, params, call)`: the row's `on` says what it is
given first (the Supervisor, the session `params.session` names, or the process
`params.id` names) and so what `Method.call` wraps it in, once for every row: a call on a
session or one of its processes runs inside `session.call()`, which keeps the session from
counting as idle, and its result is `session.reported()`; the listings (session.list,
process.list) are looks from outside and do neither. `call` (a `Call`) carries the
Supervisor, the request's tools.answers.Answer and the caller's tenant. A handler returns a
result Struct and raises ToolsdError for a reply with an error code. `cancel` is the
connection's own (it is about the connection, not the sessions).

Tenants (daemon/tenants.py): a row whose params name a session or a process says so
(`scope=SESSION` for `params.session`, `scope=PROCESS` for `params.id`), and the connection
admits a request only once `tenants.check` found that id the caller's (`Method.admit`):
another tenant's is the not_found of an unknown id, before the handler runs. A new method
that takes such an id needs nothing but its scope; tests/test_tenants.py tries every row.

Requests that need no task (connection._answer_now): a row that is `instant` has a plain
handler that never waits; a row with `now` has, besides its handler, a plain one that answers
at once when it can (turn.begin, process.list of finished processes, process.output that
waits for nothing) and otherwise returns LATER, having done nothing, for `handler` to run in a task.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING, Awaitable, Callable, Final, Generic, TypeVar

import msgspec

from toolsd.daemon import detached_rows
from toolsd.daemon import file_methods as fm
from toolsd.daemon.tenants import LOCAL, Scope, check, visible
from toolsd.tools import images, processes, repl, shell
from toolsd.wire import files as fw
from toolsd.tools.answers import Answer, Detached
from toolsd.wire.egress import SessionNetworkParams, SessionNetworkResult
from toolsd.wire.ports import (
    PortCloseParams,
    PortCloseResult,
    PortForwardParams,
    PortForwardResult,
)
from toolsd.wire.process_input import (
    ProcessResizeParams,
    ProcessResizeResult,
    ProcessWriteParams,
    ProcessWriteResult,
)
from toolsd.wire.protocol import (
    CancelParams,
    HelloParams,
    ImageReadParams,
    ImageReadResult,
    ProcessListParams,
    ProcessListResult,
    ProcessOutputParams,
    ProcessOutputResult,
    ProcessStartParams,
    ProcessStartResult,
    ProcessStopParams,
    ProcessStopResult,
    ReplExecParams,
    ReplExecResult,
    Request,
    SessionCloseResult,
    SessionListParams,
    SessionListResult,
    SessionOpenParams,
    SessionOpenResult,
    SessionParams,
    ShellRunParams,
    ShellRunResult,
    TurnBeginResult,
    TurnEndParams,
    TurnEndResult,
    decode_params,
)

if TYPE_CHECKING:
    from toolsd.daemon.session import Session
    from toolsd.daemon.supervisor import Supervisor
    from toolsd.tools.background_process import BackgroundProcess

__all__ = ["METHODS", "Method", "On", "Call", "CancelParams", "decode", "LATER"]

P = TypeVar("P", bound=msgspec.Struct)

# What a row's `now` handler returns when the request needs a task after all.
LATER: Final = object()


class On(enum.Enum):
    """What a row's handler is given first, and so what the connection wraps it in."""

    DAEMON = "daemon"  # the Supervisor
    # The session `params.session` names, the call inside its `call()` (it is not idle
    # meanwhile) and the result `reported()` (host_exec, refused connections).
    SESSION = "session"
    # The process `params.id` names (in `params.session` if given), inside its session's
    # `call()`, the result reported by that session.
    PROCESS = "process"


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """What a handler may need besides its target and params: the Supervisor, the request's
    Answer (stream events, after-answer hooks; None for an instant row), the caller's
    tenant."""

    sup: Supervisor
    answer: Answer | None
    tenant: str


@dataclasses.dataclass(frozen=True, slots=True)
class Method(Generic[P]):
    """One wire method: how its params decode, who handles it, on what, and whether it can
    start without a task of its own."""

    params: type[P]
    # (target, params, Call) -> result Struct: a coroutine function, or a plain one for an
    # `instant` row.
    handler: Callable[..., Awaitable[object]] | Callable[..., object]
    on: On = On.DAEMON
    # A SESSION or PROCESS row whose result has no host_exec (file.watch) says False.
    reports: bool = True
    # (supervisor, params, detached) -> True if it took the request: it will answer through
    # `detached`, or hand the rest to a task with detached.escalate(). False, or ToolsdError,
    # before doing anything (work it gave `detached.after` is then dropped): the request
    # then runs the usual way, which answers any error.
    detached: Callable[[Supervisor, P, Detached], bool] | None = None
    # Which id in the params names what the call touches: tenants.check runs on it before
    # the handler, so another tenant's id is not_found (daemon/tenants.py).
    scope: Scope = Scope.NONE
    # The handler never waits (a plain function on the Supervisor): the connection answers
    # the request in the task that read it, with no task or cancel scope of its own
    # (connection._answer_now).
    instant: bool = False
    # A plain handler, on the same target, tried first in the task that read the request:
    # its result is the answer, or it returns LATER, having changed nothing, and `handler`
    # runs in a task of its own.
    now: Callable[..., object] | None = None
    # A pure test on the params, asked before anything else (host_exec's look included):
    # False, and the request needs a task (`now` is not tried). For a `now` that would say
    # LATER from its params alone (a read that waits).
    now_if: Callable[[P], bool] | None = None

    def decode(self, request: Request) -> P:
        return decode(self.params, request)

    def admit(self, sup: Supervisor, request: Request, tenant: str) -> P:
        """The params, once `tenant` may touch what they name (else ToolsdError)."""
        params = decode_params(self.params, request.params, request.method)
        if self.scope is not Scope.NONE:
            check(sup, tenant, self.scope, params)
        return params

    async def call(self, sup: Supervisor, params: P, answer: Answer | None,
                   tenant: str) -> object:
        """The handler's result for these (admitted) params, on the row's target."""
        call = Call(sup, answer, tenant)
        if self.on is On.DAEMON:
            result = self.handler(sup, params, call)
            return result if self.instant else await result
        target, session = self._target(sup, params)
        with session.call():
            result = await self.handler(target, params, call)
            return await session.reported(result) if self.reports else result

    def call_now(self, params: P, call: Call) -> object:
        """An instant row's result, or a `now` row's when it has one at once (else LATER).
        `call` has no Answer, so one serves every such request of a connection."""
        if self.now_if is not None and not self.now_if(params):
            return LATER
        sup = call.sup
        if self.instant:
            return self.handler(sup, params, call)
        if self.on is On.DAEMON:
            return self.now(sup, params, call)
        target, session = self._target(sup, params)
        # As session.reported, but looked at first: LATER must come before anything is done.
        host_exec = session.repositories.look_now() if self.reports else []
        if host_exec is None:
            return LATER  # looking needs a worker thread
        try:
            result = self.now(target, params, call)
        finally:
            session.ran_call()
        if result is LATER or not self.reports:
            return result
        return session.reported_as(result, host_exec)

    def _target(self, sup: Supervisor, params: P) -> tuple[object, Session]:
        """What a SESSION or PROCESS row's handler is given, and the session it is in."""
        if self.on is On.SESSION:
            session = sup.session(params.session)
            return session, session
        proc = sup.processes.get(params.id, params.session)
        return proc, proc.session


def hello(sup: Supervisor, p: HelloParams, call: Call) -> msgspec.Raw:
    return sup.hello_result(call.tenant)  # a HelloResult, encoded


async def session_open(sup: Supervisor, p: SessionOpenParams, call: Call) -> SessionOpenResult:
    session = await sup.open_session(p, call.tenant)
    return SessionOpenResult(session=session.id, sandbox=session.sandbox_kind,
                             workspace=session.workspace)


async def session_close(sup: Supervisor, p: SessionParams,
                        call: Call) -> SessionCloseResult | None:
    return await sup.close_session(p.session)


def session_list(sup: Supervisor, p: SessionListParams, call: Call) -> SessionListResult:
    return SessionListResult(sessions=[s.info(sup.forwards.info(s.id))
                                       for s in sup.open_sessions()
                                       if visible(call.tenant, s.tenant)])


def session_network(sup: Supervisor, p: SessionNetworkParams,
                    call: Call) -> SessionNetworkResult:
    return sup.session(p.session).net.listing(p.since)  # daemon/egress.py


def turn_begin_now(session: Session, p: SessionParams, call: Call) -> TurnBeginResult:
    session.check_open()
    return TurnBeginResult(turn=session.turns.begin(session.id))


async def turn_begin(session: Session, p: SessionParams, call: Call) -> TurnBeginResult:
    return turn_begin_now(session, p, call)  # when looking at host_exec needs a thread


async def turn_end(session: Session, p: TurnEndParams, call: Call) -> TurnEndResult:
    return TurnEndResult(repls_stopped=await session.turns.end(p.turn, session.id))


async def shell_run(session: Session, p: ShellRunParams, call: Call) -> ShellRunResult:
    return await shell.run(session, p, call.answer)


async def repl_exec(session: Session, p: ReplExecParams, call: Call) -> ReplExecResult:
    return await repl.execute(session, p, call.answer)


async def process_start(session: Session, p: ProcessStartParams,
                        call: Call) -> ProcessStartResult:
    return await processes.start(call.sup.processes, session, p)


async def process_output(proc: BackgroundProcess, p: ProcessOutputParams,
                         call: Call) -> ProcessOutputResult:
    return detached_rows.with_egress(proc, p, await processes.output(proc, p, call.answer))


def process_output_now(proc: BackgroundProcess, p: ProcessOutputParams, call: Call) -> object:
    result = processes.output_now(proc, p)
    return LATER if result is None else detached_rows.with_egress(proc, p, result)


async def process_stop(proc: BackgroundProcess, p: ProcessStopParams,
                       call: Call) -> ProcessStopResult:
    return await processes.stop(proc, p)


async def process_write(proc: BackgroundProcess, p: ProcessWriteParams,
                        call: Call) -> ProcessWriteResult:
    return await processes.write(proc, p)


async def process_resize(proc: BackgroundProcess, p: ProcessResizeParams,
                         call: Call) -> ProcessResizeResult:
    return await processes.resize(proc, p)


async def port_forward(session: Session, p: PortForwardParams, call: Call) -> PortForwardResult:
    return await call.sup.forwards.forward(session, p)


async def port_close(session: Session, p: PortCloseParams, call: Call) -> PortCloseResult:
    return await call.sup.forwards.close(session, p.port)


async def process_list(sup: Supervisor, p: ProcessListParams, call: Call) -> ProcessListResult:
    return await processes.listing(sup.processes, p, _tenants_own(call.tenant))


def process_list_now(sup: Supervisor, p: ProcessListParams, call: Call) -> object:
    listed = processes.listing_now(sup.processes, p, _tenants_own(call.tenant))
    return LATER if listed is None else listed


def _tenants_own(tenant: str) -> Callable[[BackgroundProcess], bool] | None:
    """Which processes `tenant` may list: the local tenant every one."""
    if tenant == LOCAL:
        return None
    return lambda bg: bg.session.tenant == tenant


async def image_read(session: Session, p: ImageReadParams, call: Call) -> ImageReadResult:
    return await images.read(session, p)


SESSION, PROCESS = Scope.SESSION, Scope.PROCESS

ON_SESSION, ON_PROCESS = On.SESSION, On.PROCESS

METHODS: Final[dict[str, Method]] = {
    "hello": Method(HelloParams, hello, instant=True),
    "session.open": Method(SessionOpenParams, session_open),
    "session.close": Method(SessionParams, session_close, scope=SESSION),
    "session.list": Method(SessionListParams, session_list, instant=True),
    "session.network": Method(SessionNetworkParams, session_network, scope=SESSION,
                              instant=True),
    "turn.begin": Method(SessionParams, turn_begin, ON_SESSION, scope=SESSION,
                         now=turn_begin_now),
    "turn.end": Method(TurnEndParams, turn_end, ON_SESSION, scope=SESSION),
    "shell.run": Method(ShellRunParams, shell_run, ON_SESSION, scope=SESSION),
    "repl.exec": Method(ReplExecParams, repl_exec, ON_SESSION, detached=detached_rows.repl_exec,
                        scope=SESSION),
    "process.start": Method(ProcessStartParams, process_start, ON_SESSION, scope=SESSION),
    "process.output": Method(ProcessOutputParams, process_output, ON_PROCESS, scope=PROCESS,
                             now=process_output_now, now_if=processes.waits_for_nothing,
                             detached=detached_rows.process_output),
    "process.stop": Method(ProcessStopParams, process_stop, ON_PROCESS, scope=PROCESS),
    "process.write": Method(ProcessWriteParams, process_write, ON_PROCESS, scope=PROCESS),
    "process.resize": Method(ProcessResizeParams, process_resize, ON_PROCESS, scope=PROCESS),
    "process.list": Method(ProcessListParams, process_list, scope=SESSION,
                           now=process_list_now),
    "image.read": Method(ImageReadParams, image_read, ON_SESSION, scope=SESSION),
    "port.forward": Method(PortForwardParams, port_forward, ON_SESSION, scope=SESSION),
    "port.close": Method(PortCloseParams, port_close, ON_SESSION, scope=SESSION),
    "file.read": Method(fw.FileReadParams, fm.file_read, ON_SESSION, scope=SESSION),
    "file.write": Method(fw.FileWriteParams, fm.file_write, ON_SESSION, scope=SESSION),
    "file.list": Method(fw.FileListParams, fm.file_list, ON_SESSION, scope=SESSION),
    "file.stat": Method(fw.FileStatParams, fm.file_stat, ON_SESSION, scope=SESSION),
    "file.mkdir": Method(fw.FileMkdirParams, fm.file_mkdir, ON_SESSION, scope=SESSION),
    "file.remove": Method(fw.FileRemoveParams, fm.file_remove, ON_SESSION, scope=SESSION),
    "file.rename": Method(fw.FileRenameParams, fm.file_rename, ON_SESSION, scope=SESSION),
    "file.watch": Method(fw.FileWatchParams, fm.file_watch, ON_SESSION, reports=False,
                         scope=SESSION),
}


def decode(params_type: type[P], request: Request) -> P:
    return decode_params(params_type, request.params, request.method)
