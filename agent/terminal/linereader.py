"""Lines of a file descriptor (stdin), read under trio so that waiting for one can be
cancelled: Ctrl-C during an approval question (`toolsd agent`), SIGTERM while an MCP client
keeps stdin open (`toolsd mcp`).

Each read runs in a worker thread, one at a time. The end of input is taken once per
`readline` that meets it: on a terminal, Ctrl-D on an empty line is an end of input of the
moment (an approval it answers is declined, and the next prompt is read as usual), not for
good; a pipe at its end answers None to every read after. A read whose caller was cancelled stays
pending and its line goes to the next caller, so a typed line is neither lost nor read twice.
os.read, not sys.stdin: a thread left blocked in a buffered read would hold the buffer's lock
when the interpreter exits; here an abandoned thread holds nothing. The descriptor is not
made non-blocking: on a terminal that would change it for the shell too.

Resource handling: the reading task lives in the `nursery` given; cancelling that nursery
abandons a read in flight. The descriptor stays the caller's.
"""

from __future__ import annotations

import os

import trio

__all__ = ["LineReader"]

READ_SIZE = 65536


class LineReader:
    def __init__(self, fd: int, nursery: trio.Nursery):
        self._fd = fd
        self._nursery = nursery
        self._buffer = bytearray()
        self._scanned = 0  # no newline in the buffer before this
        self._eof = False
        self._pending: trio.Event | None = None  # set while a read is in flight
        self._stops = b"\n"  # what the last scan looked for
        # What ended the line last returned: one of the `stops` bytes, or b"" (end of input).
        self.ended_by = b""

    def _find(self, stops: bytes) -> int:
        found = [i for i in (self._buffer.find(stop, self._scanned) for stop in stops)
                 if i >= 0]
        return min(found, default=-1)

    async def readline(self, stops: bytes = b"\n") -> str | None:
        """The next line without what ended it (a newline, or another of the `stops` bytes:
        `ended_by` says which; the last line may have none); None at the end of input."""
        if stops != self._stops:
            self._stops, self._scanned = stops, 0
        while True:
            end = self._find(stops)
            if end >= 0 or self._eof:
                break
            self._scanned = len(self._buffer)
            if self._pending is None:
                self._pending = trio.Event()
                self._nursery.start_soon(self._read, self._pending)
            await self._pending.wait()
        if end < 0:
            self._eof = False  # taken: a terminal reads on after a Ctrl-D
            self.ended_by = b""
            if not self._buffer:
                return None
            end = len(self._buffer)
        else:
            self.ended_by = bytes(self._buffer[end:end + 1])
        line = bytes(self._buffer[:end])
        del self._buffer[:end + 1]
        self._scanned = 0
        return line.decode(errors="replace")

    async def _read(self, done: trio.Event) -> None:
        try:
            data = await trio.to_thread.run_sync(os.read, self._fd, READ_SIZE,
                                                 abandon_on_cancel=True)
        except OSError:
            data = b""
        self._eof = not data
        self._buffer += data
        self._pending = None
        done.set()

    async def __aiter__(self):
        """Each line, with its newline, until the end of input (what the MCP SDK's stdio
        transport iterates)."""
        while (line := await self.readline()) is not None:
            yield line + "\n"
