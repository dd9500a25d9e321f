"""What a handler gets for its request besides the Supervisor and the params: the request's
Answer, and for a method that can start without a task, its Detached side.

Both are implemented by the connection's entry for the request (daemon/requests.py); a tool
sees only these Protocols, never the connection. docs/sequences.md shows where each is used.
"""

from __future__ import annotations

from typing import Awaitable, Callable, Protocol

__all__ = ["Answer", "Detached"]


class Answer(Protocol):
    """The way back of one request, handed to its handler."""

    def after(self, fn: Callable[[], None]) -> None:
        """Call `fn()` once the answer has started out (its first write), or at once when
        the answer must wait behind others or cannot be written: work that must not delay
        the answer (shell.run lets its shim go), nor wait on a client that reads slowly.
        Runs exactly once, whoever answers."""

    async def emit(self, data: str) -> None:
        """Send one output event of the request (protocol 1.1 "stream": only to a request
        that asked, only before its answer; at most wire.events.EVENT_MAX_BYTES), returning
        once it is out: the socket is the flow control, so a client that does not read
        holds the tool that emits. Cancelled before its first byte it sends nothing; after,
        the rest of the frame still goes out whole (before the answer)."""


    @property
    def request_id(self) -> int:
        """The request's id, for an event frame a tool encodes itself (emit_encoded)."""

    async def emit_encoded(self, body: bytes) -> None:
        """Send one event frame whose body the tool encoded itself (a file.watch's event,
        wire/files.py), as `emit` sends an output event."""


class Detached(Answer, Protocol):
    """A request in flight with no task of its own. A repl.exec on an idle, running
    interpreter needs none: the task that read it writes its code to the interpreter and
    goes back to reading, and the task that reads the interpreter's output answers it when
    the sentinel comes. Each task less is a pass less of trio's scheduler. Anything out of
    the ordinary (a timeout, a `cancel`, the client going away, the interpreter dying) hands
    the rest of the request to a task (`escalate`), which answers it as a handler would."""

    # Set by whoever starts the request: finishes it in a task, from any point, returning
    # its result or raising as a handler does, within the request's cancel scope.
    rest: Callable[[], Awaitable[object]] | None

    @property
    def can_finish(self) -> bool:
        """Whether `finish` would answer now: no task has the request, and it is not
        answered. For a tool that must know before it changes anything for the answer."""

    def finish(self, result: object) -> bool:
        """Answer with `result`, unless a task has the request now (False: that task will
        answer). Synchronous; never raises."""

    def escalate(self) -> None:
        """Hand the rest of the request to a task (`rest`); once only, and never after it
        was answered. Synchronous; never raises."""
