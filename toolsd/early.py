"""Answering a request from another task than the one that runs it.

A handler whose answer is found by another task (repl.exec: the task reading the interpreter's
output finds the sentinel) would otherwise wake its own task to send it, one more pass of
trio's scheduler between the answer and the client, about a sixth of a repl.exec round trip.
With `current()` it gets this request's `EarlyAnswer` and hands it to that task, which sends
the result at once when it can. The handler still returns its result as usual; the connection
does not send it twice. No I/O here: the connection does the writing.
"""

from __future__ import annotations

import contextvars
from typing import Protocol

__all__ = ["EarlyAnswer", "current"]


class _Sender(Protocol):
    def answer_early(self, request_id: int, result: object) -> bool: ...


class EarlyAnswer:
    """The answer of one request; `send` is synchronous and never raises."""

    __slots__ = ("_sender", "request_id", "sent")

    def __init__(self, sender: _Sender, request_id: int):
        self._sender = sender
        self.request_id = request_id
        self.sent = False

    def send(self, result: object) -> bool:
        """Send `result` now if the connection can take it without waiting; False if not (the
        request was cancelled, or another answer is being written), and the handler's
        return value goes out as usual."""
        if not self.sent:
            self.sent = self._sender.answer_early(self.request_id, result)
        return self.sent


_CURRENT: contextvars.ContextVar[EarlyAnswer | None] = contextvars.ContextVar(
    "toolsd_early_answer", default=None)


def current() -> EarlyAnswer | None:
    """The answer of the request this task runs (None outside a request)."""
    return _CURRENT.get()


def serving(answer: EarlyAnswer) -> contextvars.Token:
    return _CURRENT.set(answer)


def done(token: contextvars.Token) -> None:
    _CURRENT.reset(token)
