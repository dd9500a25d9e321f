"""One handler per wire method, and the table the server dispatches with.

Each handler takes the Supervisor and the decoded params Struct and returns a result Struct;
it raises ToolsdError for a reply with an error code. `cancel` is the server's own (it is about
the connection, not the sessions). A call that names a session or one of its processes runs
inside `session.call()`, which keeps the session from counting as idle; the listings
(session.list, process.list) are looks from outside and do not.
"""

from __future__ import annotations

import trio

from toolsd.tools import images, processes, repl, shell
from toolsd.wire.protocol import (
    FEATURES,
    CancelParams,
    HelloParams,
    HelloResult,
    ImageReadParams,
    ProcessListParams,
    ProcessOutputParams,
    ProcessStartParams,
    ProcessStopParams,
    ReplExecParams,
    SessionListParams,
    SessionListResult,
    SessionOpenParams,
    SessionOpenResult,
    SessionParams,
    ShellRunParams,
    TurnBeginResult,
    TurnEndParams,
    TurnEndResult,
    decode_params,
)

__all__ = ["METHODS", "DETACHED", "CancelParams", "decode"]


async def hello(sup, p: HelloParams) -> HelloResult:
    return HelloResult(
        protocol=1,
        server=sup.server_name,
        sandbox=sup.sandbox_kind,
        shells=sup.host_shells,
        languages=sup.host_languages,
        max_frame=sup.config.max_frame,
        features=list(FEATURES),
    )


async def session_open(sup, p: SessionOpenParams) -> SessionOpenResult:
    session = await sup.open_session(p)
    return SessionOpenResult(session=session.id, sandbox=session.sandbox_kind,
                             workspace=session.workspace)


async def session_close(sup, p: SessionParams):
    return await sup.close_session(p.session)


async def session_list(sup, p: SessionListParams) -> SessionListResult:
    return SessionListResult(sessions=[s.info() for s in sup.open_sessions()])


async def turn_begin(sup, p: SessionParams) -> TurnBeginResult:
    with sup.session(p.session).call() as session:
        return await session.reported(TurnBeginResult(turn=session.begin_turn()))


async def turn_end(sup, p: TurnEndParams) -> TurnEndResult:
    with sup.session(p.session).call() as session:
        return await session.reported(TurnEndResult(
            repls_stopped=await session.end_turn(p.turn)))


async def shell_run(sup, p: ShellRunParams):
    with sup.session(p.session).call() as session:
        return await session.reported(await shell.run(session, p))


async def repl_exec(sup, p: ReplExecParams):
    with sup.session(p.session).call() as session:
        return await session.reported(await repl.execute(session, p))


async def process_start(sup, p: ProcessStartParams):
    with sup.session(p.session).call() as session:
        return await session.reported(await processes.start(sup, session, p))


async def process_output(sup, p: ProcessOutputParams):
    proc = sup.process(p.id)
    with proc.session.call():
        return await proc.session.reported(await processes.output(proc, p))


async def process_stop(sup, p: ProcessStopParams):
    proc = sup.process(p.id)
    with proc.session.call():
        return await proc.session.reported(await processes.stop(proc, p))


async def process_list(sup, p: ProcessListParams):
    return await processes.listing(sup, p)


async def image_read(sup, p: ImageReadParams):
    with sup.session(p.session).call() as session:
        return await session.reported(await images.read(session, p))


METHODS = {
    "hello": (HelloParams, hello),
    "session.open": (SessionOpenParams, session_open),
    "session.close": (SessionParams, session_close),
    "session.list": (SessionListParams, session_list),
    "turn.begin": (SessionParams, turn_begin),
    "turn.end": (TurnEndParams, turn_end),
    "shell.run": (ShellRunParams, shell_run),
    "repl.exec": (ReplExecParams, repl_exec),
    "process.start": (ProcessStartParams, process_start),
    "process.output": (ProcessOutputParams, process_output),
    "process.stop": (ProcessStopParams, process_stop),
    "process.list": (ProcessListParams, process_list),
    "image.read": (ImageReadParams, image_read),
}


def repl_exec_detached(sup, p: ReplExecParams, detached) -> bool:
    session = sup.session(p.session)

    def end() -> None:
        session.activity.end(trio.current_time())

    # The call is the session's activity until it is answered, by whoever answers it. Not
    # taken, the request runs the usual way (under session.call), and its Detached with
    # this hook is dropped.
    session.activity.begin()
    detached.answer.after(end)
    try:
        started = repl.start_detached(session, p, detached)
    except BaseException:
        end()
        raise
    if not started:
        end()
    return started


# Methods that can run without a task of their own (answers.Detached, where the why is):
# `start(sup, params, detached)` returns True if it took the request, or returns False or
# raises ToolsdError before doing anything, and the request then runs the usual way.
DETACHED = {
    "repl.exec": (ReplExecParams, repl_exec_detached),
}


def decode(params_type, request):
    return decode_params(params_type, request.params, request.method)
