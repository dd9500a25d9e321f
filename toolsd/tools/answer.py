"""How a request's answer gets out other than by its handler's task returning it.

- `Detached`: a request that runs without a task of its own. A repl.exec on an idle, running
  interpreter needs none: the task that read it writes its code to the interpreter and goes
  back to reading, and the task that reads the interpreter's output answers it when the
  sentinel comes. Each task less is a pass less of trio's scheduler, a fifth of a small
  repl.exec on a slow machine. Anything out of the ordinary (a timeout, a `cancel`, the
  client going away, the interpreter dying) hands the rest of the request to a task
  (`escalate`), which then answers it as any handler would.
- `Answer.after`: work that must not delay the answer (shell.run lets its shim go: closing
  the hold pipe wakes the shim, a tenth of a millisecond here) runs right after the answer's
  first write, or at once when the answer must wait behind others for a slow reader.

No I/O here: the connection does the writing.
"""

from __future__ import annotations

import logging
from typing import Awaitable, Callable, Protocol

import trio

__all__ = ["Answer", "Detached"]

log = logging.getLogger("toolsd.answer")


class _Connection(Protocol):
    def finish_detached(self, detached: Detached, result: object) -> None: ...

    def escalate(self, detached: Detached) -> None: ...


class Detached:
    """A request in flight with no task. Whoever started it sets `rest`: the coroutine
    function that finishes the request in a task, from any point, returning its result or
    raising as a handler does, and running within the request's cancel scope. `answer` is
    its Answer, whoever answers: work given to `answer.after` runs once it is answered here,
    or by the task it was handed to."""

    __slots__ = ("_connection", "request", "scope", "rest", "answer", "_over")

    def __init__(self, connection: _Connection, request, scope: trio.CancelScope):
        self._connection = connection
        self.request = request  # protocol.Request
        self.scope = scope
        self.rest: Callable[[], Awaitable[object]] | None = None
        self.answer = Answer(request.id)
        self._over = False  # answered, or handed to a task

    def after(self, fn: Callable[[], None]) -> None:
        self.answer.after(fn)

    def finish(self, result: object) -> bool:
        """Answer with `result`, unless a task has the request now (False: that task will
        answer). Synchronous; never raises."""
        if self._over:
            return False
        self._over = True
        self._connection.finish_detached(self, result)
        self.answer.run_after()
        return True

    def escalate(self) -> None:
        """Hand the rest of the request to a task (`rest`); once only, and never after it
        was answered. Synchronous; never raises."""
        if self._over:
            return
        self._over = True
        self._connection.escalate(self)


class Answer:
    __slots__ = ("request_id", "_after")

    def __init__(self, request_id: int):
        self.request_id = request_id
        self._after: list[Callable[[], None]] = []

    def after(self, fn: Callable[[], None]) -> None:
        """Call `fn()` once the answer has started out (or cannot soon, or could not be)."""
        self._after.append(fn)

    def run_after(self) -> None:
        todo, self._after = self._after, []
        for fn in todo:
            try:
                fn()
            except Exception:
                log.exception("work after the answer to request %s failed", self.request_id)
