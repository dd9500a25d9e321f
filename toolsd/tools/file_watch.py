"""file.watch: inotify inside the session's sandbox (driver/_file_watch.py), its events sent
as event frames until the request is cancelled, then `{events, dropped}`.

Memory is bounded at every stage: the kernel's queue (an overflow is counted), the helper's
queue per watch, and ours here, QUEUE_MAX events; a client that does not read holds our
emits, our queue fills, and what comes next is counted in `dropped` instead of kept.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

import trio

from toolsd.sandbox.errors import SandboxError
from toolsd.tools.answers import Answer
from toolsd.tools.files import call, check_path
from toolsd.wire.files import FileWatchParams, FileWatchResult, encode_file_event
from toolsd.wire.protocol import BAD_PARAMS, SESSION_CLOSED, ToolsdError

if TYPE_CHECKING:
    from toolsd.tools.session_view import SessionView

__all__ = ["watch", "QUEUE_MAX"]

QUEUE_MAX = 4096
# How long a cancelled watch waits for the helper's last word before answering anyway.
STOP_WAIT_S = 5.0
_KINDS = ("created", "modified", "removed", "moved")


class _Watch:
    """One watch's state, shared by the request's task (which sends the events) and the task
    that waits for the helper's final reply."""

    def __init__(self) -> None:
        self.queue: collections.deque[tuple[str, str, str | None]] = collections.deque()
        self.dropped_here = 0
        self.dropped_there = 0  # the helper's count, which includes the kernel's overflows
        self.sent = 0
        self.rid: int | None = None
        self.result: dict | None = None
        self.error: ToolsdError | SandboxError | None = None
        self.over = trio.Event()
        self.wake = trio.Event()

    def events(self, batch: list, dropped: int, started: bool) -> None:
        for kind, path, to in batch:
            if kind not in _KINDS or not isinstance(path, str):
                continue
            if len(self.queue) >= QUEUE_MAX:
                self.dropped_here += 1
            else:
                self.queue.append((kind, path, to if isinstance(to, str) else None))
        self.dropped_there = max(self.dropped_there, dropped)
        self.wake.set()

    def sent_as(self, rid: int) -> None:
        self.rid = rid

    @property
    def dropped(self) -> int:
        return self.dropped_here + self.dropped_there

    async def run(self, session: SessionView, meta: dict) -> None:
        """The helper's side of the watch, in the session's nursery: it ends with the watch
        or the session, whichever comes first."""
        try:
            self.result, _ = await call(session, meta, on_events=self.events,
                                        on_sent=self.sent_as)
            self.dropped_there = max(self.dropped_there, int(self.result.get("dropped", 0)))
        except (ToolsdError, SandboxError) as e:
            self.error = e
        finally:
            self.over.set()
            self.wake.set()


async def watch(session: SessionView, p: FileWatchParams, answer: Answer) -> FileWatchResult:
    if not p.stream:
        raise ToolsdError(BAD_PARAMS, "file.watch sends its changes as events: send it with "
                          "stream: true, and cancel it to end it")
    session.check_open()
    state = _Watch()
    meta = {"op": "watch", "path": check_path(p.path), "recursive": p.recursive}
    session.start_soon(state.run, session, meta)
    try:
        while True:
            while state.queue:
                kind, path, to = state.queue.popleft()
                await answer.emit_encoded(encode_file_event(answer.request_id, kind, path, to))
                state.sent += 1
            if state.over.is_set():
                break
            state.wake = trio.Event()
            await state.wake.wait()
    except trio.Cancelled:
        # Cancelled (the contract's way to end a watch): stop it and answer with the counts.
        # The request's own scope is cancelled, so every wait here is shielded.
        with trio.CancelScope(shield=True):
            with trio.move_on_after(STOP_WAIT_S):
                if state.rid is not None and not state.over.is_set():
                    await session.files.stop_watch(state.rid)
                await state.over.wait()
        return FileWatchResult(events=state.sent, dropped=state.dropped + len(state.queue))
    if state.error is not None:
        raise state.error
    if state.result is None:
        raise ToolsdError(SESSION_CLOSED, f"session {session.id} closed during the watch")
    return FileWatchResult(events=state.sent, dropped=state.dropped)

