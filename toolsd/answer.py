"""The answer of the request a task is running: sent from another task as soon as it is known,
and work to do once it has gone out.

- `send`: a handler whose answer is found by another task (repl.exec: the task reading the
  interpreter's output finds the sentinel) would otherwise wake its own task to send it, one
  more pass of trio's scheduler between the answer and the client, about a sixth of a
  repl.exec round trip. It hands its request's `Answer` to that task, which sends the result
  at once when it can. The handler still returns its result as usual; the connection does
  not send it twice.
- `after`: work that must not delay the answer (shell.run lets its shim go: closing the hold
  pipe wakes the shim, a tenth of a millisecond here) runs right after the answer's first
  write, or at once when the answer must wait behind others for a slow reader.

No I/O here: the connection does the writing.
"""

from __future__ import annotations

import contextvars
import logging
from typing import Callable, Protocol

import trio

__all__ = ["Answer", "current"]

log = logging.getLogger("toolsd.answer")


class _Sender(Protocol):
    def answer_early(self, request_id: int, result: object) -> bool: ...


class Answer:
    __slots__ = ("_sender", "request_id", "sent", "_after", "_task")

    def __init__(self, sender: _Sender, request_id: int):
        self._sender = sender
        self.request_id = request_id
        self.sent = False
        self._after: list[Callable[[], None]] = []
        self._task = None  # the task running the request (see serving)

    def send(self, result: object) -> bool:
        """Send `result` now if the connection can take it without waiting; False if not (the
        request was cancelled, or another answer is being written), and the handler's
        return value goes out as usual. Synchronous; never raises."""
        if not self.sent:
            self.sent = self._sender.answer_early(self.request_id, result)
        return self.sent

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


_CURRENT: contextvars.ContextVar[Answer | None] = contextvars.ContextVar(
    "toolsd_answer", default=None)


def current() -> Answer | None:
    """The answer of the request this task runs (None outside a request). Tasks started
    while a request ran (a REPL's reader, a session's task) inherit its context, not its
    answer."""
    answer = _CURRENT.get()
    if answer is None or answer._task is not trio.lowlevel.current_task():
        return None
    return answer


def serving(answer: Answer) -> contextvars.Token:
    answer._task = trio.lowlevel.current_task()
    return _CURRENT.set(answer)


def done(token: contextvars.Token) -> None:
    _CURRENT.reset(token)
