"""Live output (protocol 1.1 "stream"): a call's output sent as events before its answer.

Two sources, one way out (answers.Answer.emit, which returns once the event is out):
- `LiveOutput`: what a pump reads from a command's pipe (shell.run, repl.exec). Its sender
  task sends what the pump feeds; while more than LIVE_BYTES waits to be sent, the pump waits
  in `room()`, the pipe fills, and the command waits in its write, as a program does on a
  terminal whose reader is slow. So the output stays in the pipe, not in the daemon, and is
  not lost. Once the command has ended (or timed out) the pump must read on regardless
  (`release`): then at most RELEASED_BYTES more waits here, and what comes beyond that is left
  out of the stream (never out of the answer), which ends saying how much.
- `Follower`: a background process's output from an offset (process.output with `wait_s`),
  read from its ring and log at the client's pace. The process is never held.

Each has one task that emits, which ends by itself once told the output is complete: it is
never stopped in the middle of an event (a cancelled event that had begun still goes out
whole, connection.py), so none is sent twice.

A request that did not ask gets neither: its tool makes none.
"""

from __future__ import annotations

import contextlib
import enum

import trio

from toolsd.tools.output import event_piece
from toolsd.wire.events import EVENT_MAX_BYTES

__all__ = ["Flow", "LiveOutput", "Follower", "sending", "LIVE_BYTES", "RELEASED_BYTES"]

# Output read from a command's pipe and not yet sent, at most, while the command runs.
LIVE_BYTES = 256 << 10
# After `release`: what a pump still reads (a full pipe, a descriptor smuggled out of the
# tree) and the client has not taken yet, at most.
RELEASED_BYTES = 1 << 20


class Flow(enum.Enum):
    """How a LiveOutput takes what its pump reads."""

    HOLDING = "holding"  # the pump waits while more than LIVE_BYTES is unsent
    DRAINING = "draining"  # the pump never waits; up to RELEASED_BYTES unsent
    CUT = "cut"  # past that: the rest is left out of the stream (and counted)


_FLOWS = {Flow.HOLDING: {Flow.DRAINING}, Flow.DRAINING: {Flow.CUT}, Flow.CUT: set()}


class LiveOutput:
    """The output of one streaming call on its way out: `feed` (sync, from the pump), `room`
    (the pump's wait), the sender task `send`, and `finish` once the output is complete."""

    def __init__(self, emit):
        self._emit = emit
        self._pending = bytearray()
        self.flow = Flow.HOLDING
        self.left_out = 0
        self._more = trio.Event()
        self._room = trio.Event()
        self._line_ended = True  # the last text sent ended a line (or none was sent)
        self._notice: str | None = None  # set by finish: the output is complete
        self._done = trio.Event()

    def _move(self, to: Flow) -> None:
        assert to in _FLOWS[self.flow], f"{self.flow} -> {to}"
        self.flow = to

    def feed(self, data: bytes) -> None:
        if self.flow is Flow.DRAINING and len(self._pending) >= RELEASED_BYTES:
            self._move(Flow.CUT)
        if self.flow is Flow.CUT:
            # All that follows a gap is left out too: the stream's end says how much, where
            # the gap is.
            self.left_out += len(data)
            return
        self._pending += data
        self._more.set()

    async def room(self) -> None:
        """Until what waits to be sent is within LIVE_BYTES (at once after `release`)."""
        while self.flow is Flow.HOLDING and len(self._pending) > LIVE_BYTES:
            self._room = trio.Event()
            await self._room.wait()

    def release(self) -> None:
        """The pump must not wait any more (the command ended or is being ended). Once only
        counts: a later call changes nothing."""
        if self.flow is Flow.HOLDING:
            self._move(Flow.DRAINING)
        self._room.set()

    async def send(self) -> None:
        """The sender task, the one that emits: what comes, as it comes; once `finish` is
        called, the rest and the end, and then it returns. Never cancelled between the
        start and the end of an event but with its request: so no event is sent twice."""
        while True:
            final = self._notice is not None
            if self._pending and await self._send_piece(final):
                continue
            if final:
                break
            self._more = trio.Event()
            await self._more.wait()
        tail = []
        if self.left_out:
            tail.append(f"[... {self.left_out} bytes left out of the stream: it was read "
                        f"too slowly; the answer's output has them ...]")
        if self._notice:
            tail.append(self._notice)
        if tail:
            text = "\n".join(tail)
            await self._emit(("" if self._line_ended else "\n") + text[:EVENT_MAX_BYTES // 4])
        self._done.set()

    async def _send_piece(self, final: bool) -> bool:
        """Send the first piece of what waits; False if it is only part of a character."""
        text, used = event_piece(self._pending, EVENT_MAX_BYTES, final=final)
        if not used:
            return False
        await self._emit(text)
        del self._pending[:used]
        self._line_ended = text.endswith("\n")
        if len(self._pending) <= LIVE_BYTES:
            self._room.set()
        return True

    async def finish(self, notice: str = "") -> None:
        """The output is complete: wait until the sender has sent the rest, a line saying how
        much was left out if anything was, and `notice`, on a line of its own as the answer's
        `output` ends with it."""
        self._notice = notice
        self._more.set()
        await self._done.wait()


def sending(live: LiveOutput | None) -> contextlib.AbstractAsyncContextManager:
    """Run `live`'s sender (if any) while the body runs, which ends with `live.finish()`
    (else the sender is stopped). The body's own error comes out as it is, not in a group.
    Without `live`, a context that does nothing (and costs no generator)."""
    return _NOT_SENDING if live is None else _sending(live)


_NOT_SENDING = contextlib.nullcontext()


@contextlib.asynccontextmanager
async def _sending(live: LiveOutput):
    error = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(live.send)
        try:
            yield
        except BaseException as e:
            error = e
        nursery.cancel_scope.cancel()
    if error is not None:
        raise error


class Follower:
    """Sends a background process's output (tools/background_process.py) from `start` on, as it
    comes, and, once told where the read ends (`end_at`), up to there: `follow`, the one task
    that emits, then returns."""

    def __init__(self, proc, start: int, emit, shown=None):
        self._proc = proc
        self._emit = emit
        self._shown = shown  # text -> what a read shows of it (plain: true), if not all
        self.pos = start  # sent up to here
        self._end: int | None = None
        self._waiting = trio.CancelScope()

    def end_at(self, end: int) -> None:
        """The read's end (its `next`): `follow` sends up to there and returns. Synchronous;
        it stops a wait for more output, never an event on its way."""
        self._end = end
        self._waiting.cancel()

    async def follow(self) -> None:
        while True:
            final = self._end is not None
            finished = self._proc.finished.is_set()  # then no more output comes
            end = self._end if final else self._proc.ring.end
            await self._send_to(end, final)
            if final:
                return
            if self._end is not None:
                continue  # told while sending
            self._waiting = trio.CancelScope()
            with self._waiting:
                if finished:
                    await trio.sleep_forever()
                # More than `end`: a character cut there waits for its rest.
                await self._proc.wait_for(end, None)

    async def _send_to(self, end: int, final: bool) -> None:
        while self.pos < end:
            data, nxt, dropped = self._proc.read(self.pos, min(end - self.pos,
                                                               EVENT_MAX_BYTES + 4))
            if dropped:
                await self._emit(f"[... {dropped} bytes of output are no longer kept ...]\n")
                self.pos += dropped
            if not data:
                return
            text, used = event_piece(data, EVENT_MAX_BYTES, final=final and nxt >= end)
            if not used:
                return
            if self._shown is not None:
                text = self._shown(text)
            if text:
                await self._emit(text)
            self.pos = nxt - len(data) + used
