"""The requests in flight on one connection: each one's slot, cancel scope and detached state.

Invariant: every admitted request holds one of `limit` slots from the frame that brought it
until its answer's frame is written (or dropped because the connection is closing); one
answered and written whole in the step that read it, while a slot was free, is not even
admitted (`would_admit`). At each moment exactly one party owns an admitted request: the
task that runs it (TASK), or, for a request started without a task, its Entry as the
tools.answers.Detached the tool answers through (DETACHED); once answered, the write of its
answer (WRITING). The slot comes back once, in `release`, on the move WRITING -> RELEASED.
A request can be cancelled (found by id) while it is TASK or DETACHED, and only if it was
registered: `cancel` requests and a repeated id are not.

No I/O here: the connection starts the tasks and writes the answers (`start_task`,
`deliver`). docs/sequences.md draws the moves of a detached repl.exec.
"""

from __future__ import annotations

import logging
from typing import Awaitable, Callable

import trio

from toolsd.runtime.states import States
from toolsd.wire.protocol import Request

__all__ = ["Entry", "RequestTable", "State"]

log = logging.getLogger("toolsd.server")


class State(States):
    TASK = "task"
    DETACHED = "detached"
    WRITING = "writing"
    RELEASED = "released"


_MOVES = {
    State.TASK: {State.DETACHED, State.WRITING},
    State.DETACHED: {State.TASK, State.WRITING},
    State.WRITING: {State.RELEASED},
    State.RELEASED: set(),
}


class Entry:
    """One admitted request. It is what its handler gets as its tools.answers.Answer, and, for
    a request started without a task, as its tools.answers.Detached."""

    __slots__ = ("request", "_scope", "state", "registered", "rest", "method", "params",
                 "_after", "_table")

    def __init__(self, table: RequestTable, request: Request, registered: bool):
        self.request = request
        self.registered = registered
        self._scope: trio.CancelScope | None = None  # made on first use (see scope)
        self.state = State.TASK
        # A detached request's rest, in a task (tools.answers.Detached.rest).
        self.rest: Callable[[], Awaitable[object]] | None = None
        # Its dispatch row, looked up once by the connection (None: no such method), and its
        # params once admitted (decoded once, however it is then run).
        self.method = None
        self.params = None
        self._after: list[Callable[[], None]] = []
        self._table = table

    @property
    def scope(self) -> trio.CancelScope | None:
        """The scope its task runs in, and that `cancel` cancels. Only a registered request
        can be cancelled; the others answer at once and have none. Made when first asked
        for: most requests are answered without a task (or a cancel) ever needing it."""
        if self._scope is None and self.registered:
            self._scope = trio.CancelScope()
        return self._scope

    # ------------------------------------------------------------ tools.answers.Answer

    def after(self, fn: Callable[[], None]) -> None:
        self._after.append(fn)

    async def emit(self, data: str) -> None:
        await self._table.send_event(self.request.id, data)

    @property
    def request_id(self) -> int:
        return self.request.id

    async def emit_encoded(self, body: bytes) -> None:
        await self._table.send_event(self.request.id, body)

    def run_after(self) -> None:
        """Run the work given to `after`, once: the connection calls it as the answer's
        first write starts, and again (finding nothing) once the request is over."""
        todo, self._after = self._after, []
        for fn in todo:
            try:
                fn()
            except Exception:
                log.exception("work after the answer to request %s failed", self.request.id)

    # ------------------------------------------------------------ tools.answers.Detached

    @property
    def can_finish(self) -> bool:
        return self.state is State.DETACHED

    def finish(self, result: object) -> bool:
        if self.state is not State.DETACHED:
            return False  # a task has it: that task answers
        self._table.answered(self)
        self._table.deliver(self, result)
        self.run_after()
        return True

    def escalate(self) -> None:
        if self.state is State.DETACHED:
            self._table.escalate(self)


class RequestTable:
    def __init__(self, limit: int, *, start_task: Callable[[Entry], None],
                 deliver: Callable[[Entry, object], None],
                 send_event: Callable[[int, str | bytes], Awaitable[None]] | None = None):
        self.limit = limit
        self.taken = 0
        self._start_task = start_task  # run `entry` (its rest, if it has one) in a task
        self.deliver = deliver  # write a detached request's answer; release once written
        self.send_event = send_event  # write one event of a request (tools.answers.Answer.emit)
        self._registered: dict[int, Entry] = {}

    def admit(self, request: Request) -> Entry | None:
        """The request's entry, holding a slot, in TASK; None when every slot is taken (the
        caller answers limit_exceeded, or carries out a `cancel` at once). Registered now,
        not when its task starts: a `cancel` right behind it in the same read finds it."""
        if self.taken >= self.limit:
            return None
        self.taken += 1
        registered = request.method != "cancel" and request.id not in self._registered
        entry = Entry(self, request, registered)
        if registered:
            self._registered[request.id] = entry
        return entry

    def would_admit(self, request: Request) -> bool:
        """Whether `admit` would give it a slot and register it (a `cancel` is never
        registered): a request the connection then answers and writes whole in the same
        step need not be admitted at all, as its slot would come back before anyone could
        look."""
        return self.taken < self.limit and (request.method == "cancel"
                                            or request.id not in self._registered)

    def find(self, request_id: int) -> Entry | None:
        """The registered request with this id, while it is TASK or DETACHED."""
        return self._registered.get(request_id)

    def detach(self, entry: Entry) -> None:
        """Before its method's starter runs: the request has no task."""
        assert entry.registered
        self._move(entry, State.DETACHED)

    def undetach(self, entry: Entry) -> None:
        """Its starter did not take it: it runs the usual way, in a task. What the starter
        gave it (its rest, its work after the answer) was for the path without a task, and
        the starter undid it: it is dropped, or the task's answer would run it again."""
        entry.rest = None
        entry._after.clear()
        self._move(entry, State.TASK)

    def escalate(self, entry: Entry) -> None:
        """A detached request gets a task, which runs its `rest` and answers."""
        self._move(entry, State.TASK)
        self._start_task(entry)

    def answered(self, entry: Entry) -> None:
        """Its answer is ready: it can no longer be cancelled, and its write owns it."""
        self._move(entry, State.WRITING)
        if entry.registered and self._registered.get(entry.request.id) is entry:
            del self._registered[entry.request.id]

    def release(self, entry: Entry) -> None:
        """Its answer is written (or dropped): the slot comes back. The only place it does."""
        self._move(entry, State.RELEASED)
        self.taken -= 1

    def cancel_all(self) -> None:
        """The connection is closing: every request without a task gets one, which undoes
        what it started (the tasks themselves are cancelled by the connection)."""
        for entry in list(self._registered.values()):
            entry.escalate()

    def _move(self, entry: Entry, to: State) -> None:
        assert to in _MOVES[entry.state], f"request {entry.request.id}: {entry.state} -> {to}"
        entry.state = to
