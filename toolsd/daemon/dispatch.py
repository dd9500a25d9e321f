"""The table the connection dispatches with: one row per wire method (`Method`), and its
handler.

Each handler takes the Supervisor and the decoded params Struct (and, for a row that says
`takes_answer`, the request's tools.calls.Answer) and returns a result Struct; it raises
ToolsdError for a reply with an error code. `cancel` is the connection's own (it is about
the connection, not the sessions). A call that names a session or one of its processes runs
inside `session.call()`, which keeps the session from counting as idle; the listings
(session.list, process.list) are looks from outside and do not.

Tenants (daemon/tenants.py): a row whose params name a session or a process says so
(`scope=SESSION` for `params.session`, `scope=PROCESS` for `params.id`), and the connection
admits a request only once `tenants.check` found that id the caller's (`Method.admit`):
another tenant's is the not_found of an unknown id, before the handler runs. A new method
that takes such an id needs nothing but its scope; tests/test_tenants.py tries every row.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Awaitable, Callable, Final, Generic, TypeVar

import msgspec
import trio

from toolsd.daemon import file_methods as fm
from toolsd.daemon.tenants import LOCAL, Scope, check, visible
from toolsd.tools import images, processes, repl, shell
from toolsd.wire import files as fw
from toolsd.tools.calls import Answer, Detached
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
    FEATURES,
    CancelParams,
    HelloParams,
    HelloResult,
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
    from toolsd.daemon.supervisor import Supervisor

__all__ = ["METHODS", "Method", "CancelParams", "decode"]

P = TypeVar("P", bound=msgspec.Struct)


@dataclasses.dataclass(frozen=True, slots=True)
class Method(Generic[P]):
    """One wire method: how its params decode, who handles it, and whether it can start
    without a task of its own."""

    params: type[P]
    # (supervisor, params) -> result Struct; (supervisor, params, answer) if takes_answer.
    # A coroutine function, or a plain one for an `instant` row.
    handler: Callable[..., Awaitable[object]] | Callable[..., object]
    takes_answer: bool = False
    # (supervisor, params, detached) -> True if it took the request: it will answer through
    # `detached`, or hand the rest to a task with detached.escalate(). False, or ToolsdError,
    # before doing anything (work it gave `detached.after` is then dropped): the request
    # then runs the usual way, which answers any error.
    detached: Callable[[Supervisor, P, Detached], bool] | None = None
    # Which id in the params names what the call touches: tenants.check runs on it before
    # the handler, so another tenant's id is not_found (daemon/tenants.py).
    scope: Scope = Scope.NONE
    # The handler also takes `tenant=` (the caller's): for what lists or makes sessions.
    takes_tenant: bool = False
    # The handler never waits (a plain function): the connection answers the request in the
    # task that read it, with no task or cancel scope of its own (connection._answer_now).
    instant: bool = False

    def decode(self, request: Request) -> P:
        return decode(self.params, request)

    def admit(self, sup: Supervisor, request: Request, tenant: str) -> P:
        """The params, once `tenant` may touch what they name (else ToolsdError)."""
        params = decode(self.params, request)
        check(sup, tenant, self.scope, params)
        return params

    def call(self, sup: Supervisor, params: P, answer: Answer, tenant: str):
        """The handler's awaitable for these (admitted) params."""
        extra = {"tenant": tenant} if self.takes_tenant else {}
        if self.instant:
            return _ready(self.handler(sup, params, **extra))
        if self.takes_answer:
            return self.handler(sup, params, answer, **extra)
        return self.handler(sup, params, **extra)

    def call_now(self, sup: Supervisor, params: P, tenant: str) -> object:
        """An instant row's result."""
        return self.handler(sup, params, **({"tenant": tenant} if self.takes_tenant else {}))


async def _ready(result: object) -> object:
    return result


def hello(sup: Supervisor, p: HelloParams, tenant: str = LOCAL) -> HelloResult:
    return HelloResult(
        protocol=1,
        server=sup.server_name,
        sandbox=sup.host.sandbox_kind,
        shells=sup.host_shells,
        languages=sup.host_languages,
        max_frame=sup.config.max_frame,
        features=list(FEATURES),
        tenant=tenant,
    )


async def session_open(sup: Supervisor, p: SessionOpenParams,
                       tenant: str = LOCAL) -> SessionOpenResult:
    session = await sup.open_session(p, tenant)
    return SessionOpenResult(session=session.id, sandbox=session.sandbox_kind,
                             workspace=session.workspace)


async def session_close(sup: Supervisor, p: SessionParams) -> SessionCloseResult | None:
    return await sup.close_session(p.session)


def session_list(sup: Supervisor, p: SessionListParams,
                       tenant: str = LOCAL) -> SessionListResult:
    return SessionListResult(sessions=[s.info(sup.forwards.info(s.id))
                                       for s in sup.open_sessions()
                                       if visible(tenant, s.tenant)])


def session_network(sup: Supervisor, p: SessionNetworkParams) -> SessionNetworkResult:
    return sup.session(p.session).net.listing(p.since)  # daemon/egress.py


async def turn_begin(sup: Supervisor, p: SessionParams) -> TurnBeginResult:
    with sup.session(p.session).call() as session:
        session.check_open()
        return await session.reported(TurnBeginResult(turn=session.turns.begin()))


async def turn_end(sup: Supervisor, p: TurnEndParams) -> TurnEndResult:
    with sup.session(p.session).call() as session:
        return await session.reported(TurnEndResult(
            repls_stopped=await session.turns.end(p.turn, session.id)))


async def shell_run(sup: Supervisor, p: ShellRunParams, answer: Answer) -> ShellRunResult:
    with sup.session(p.session).call() as session:
        return await session.reported(await shell.run(session, p, answer))


async def repl_exec(sup: Supervisor, p: ReplExecParams, answer: Answer) -> ReplExecResult:
    with sup.session(p.session).call() as session:
        return await session.reported(await repl.execute(session, p, answer))


async def process_start(sup: Supervisor, p: ProcessStartParams) -> ProcessStartResult:
    with sup.session(p.session).call() as session:
        return await session.reported(await processes.start(sup.processes, session, p))


async def process_output(sup: Supervisor, p: ProcessOutputParams,
                         answer: Answer) -> ProcessOutputResult:
    proc = sup.processes.get(p.id, p.session)
    with proc.session.call():
        result = await processes.output(proc, p, answer)
        proc.session.net.report_output(result, proc, moves_mark=p.since is None)  # egress
        return await proc.session.reported(result)


async def process_stop(sup: Supervisor, p: ProcessStopParams) -> ProcessStopResult:
    proc = sup.processes.get(p.id, p.session)
    with proc.session.call():
        return await proc.session.reported(await processes.stop(proc, p))


async def process_write(sup: Supervisor, p: ProcessWriteParams) -> ProcessWriteResult:
    proc = sup.processes.get(p.id, p.session)
    with proc.session.call():
        return await proc.session.reported(await processes.write(proc, p))


async def process_resize(sup: Supervisor, p: ProcessResizeParams) -> ProcessResizeResult:
    proc = sup.processes.get(p.id, p.session)
    with proc.session.call():
        return await proc.session.reported(await processes.resize(proc, p))


async def port_forward(sup: Supervisor, p: PortForwardParams) -> PortForwardResult:
    with sup.session(p.session).call() as session:
        return await session.reported(await sup.forwards.forward(session, p))


async def port_close(sup: Supervisor, p: PortCloseParams) -> PortCloseResult:
    with sup.session(p.session).call() as session:
        return await session.reported(await sup.forwards.close(session, p.port))


async def process_list(sup: Supervisor, p: ProcessListParams,
                       tenant: str = LOCAL) -> ProcessListResult:
    listed = await processes.listing(sup.processes, p)
    if tenant != LOCAL:
        mine = {bg.id for bg in sup.processes if bg.session.tenant == tenant}
        listed.processes = [info for info in listed.processes if info.id in mine]
    return listed


async def image_read(sup: Supervisor, p: ImageReadParams) -> ImageReadResult:
    with sup.session(p.session).call() as session:
        return await session.reported(await images.read(session, p))


def repl_exec_detached(sup: Supervisor, p: ReplExecParams, detached: Detached) -> bool:
    session = sup.session(p.session)

    def end() -> None:
        session.activity.end(trio.current_time())

    # The call is the session's activity until it is answered, by whoever answers it. Not
    # taken, the request runs the usual way (under session.call), and its Detached with
    # this hook is dropped.
    session.activity.begin()
    detached.after(end)
    try:
        started = repl.start_detached(session, p, detached)
    except BaseException:
        end()
        raise
    if not started:
        end()
    return started


SESSION, PROCESS = Scope.SESSION, Scope.PROCESS

METHODS: Final[dict[str, Method]] = {
    "hello": Method(HelloParams, hello, takes_tenant=True, instant=True),
    "session.open": Method(SessionOpenParams, session_open, takes_tenant=True),
    "session.close": Method(SessionParams, session_close, scope=SESSION),
    "session.list": Method(SessionListParams, session_list, takes_tenant=True, instant=True),
    "session.network": Method(SessionNetworkParams, session_network, scope=SESSION,
                              instant=True),
    "turn.begin": Method(SessionParams, turn_begin, scope=SESSION),
    "turn.end": Method(TurnEndParams, turn_end, scope=SESSION),
    "shell.run": Method(ShellRunParams, shell_run, takes_answer=True, scope=SESSION),
    "repl.exec": Method(ReplExecParams, repl_exec, takes_answer=True,
                        detached=repl_exec_detached, scope=SESSION),
    "process.start": Method(ProcessStartParams, process_start, scope=SESSION),
    "process.output": Method(ProcessOutputParams, process_output, takes_answer=True,
                             scope=PROCESS),
    "process.stop": Method(ProcessStopParams, process_stop, scope=PROCESS),
    "process.write": Method(ProcessWriteParams, process_write, scope=PROCESS),
    "process.resize": Method(ProcessResizeParams, process_resize, scope=PROCESS),
    "process.list": Method(ProcessListParams, process_list, scope=SESSION, takes_tenant=True),
    "image.read": Method(ImageReadParams, image_read, scope=SESSION),
    "port.forward": Method(PortForwardParams, port_forward, scope=SESSION),
    "port.close": Method(PortCloseParams, port_close, scope=SESSION),
    "file.read": Method(fw.FileReadParams, fm.file_read, scope=SESSION),
    "file.write": Method(fw.FileWriteParams, fm.file_write, scope=SESSION),
    "file.list": Method(fw.FileListParams, fm.file_list, scope=SESSION),
    "file.stat": Method(fw.FileStatParams, fm.file_stat, scope=SESSION),
    "file.mkdir": Method(fw.FileMkdirParams, fm.file_mkdir, scope=SESSION),
    "file.remove": Method(fw.FileRemoveParams, fm.file_remove, scope=SESSION),
    "file.rename": Method(fw.FileRenameParams, fm.file_rename, scope=SESSION),
    "file.watch": Method(fw.FileWatchParams, fm.file_watch, takes_answer=True, scope=SESSION),
}


def decode(params_type: type[P], request: Request) -> P:
    return decode_params(params_type, request.params, request.method)
