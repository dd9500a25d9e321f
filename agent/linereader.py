"""Lines of a file descriptor (stdin), read under trio so that waiting for one can be
cancelled: Ctrl-C during an approval question (`toolsd agent`), SIGTERM while an MCP client
keeps stdin open (`toolsd mcp`).

Each read runs in a worker thread, one at a time. A read whose caller was cancelled stays
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

    async def readline(self) -> str | None:
        """The next line without its newline (the last one may have none); None at the end
        of input."""
        while True:
            end = self._buffer.find(b"\n", self._scanned)
            if end >= 0 or self._eof:
                break
            self._scanned = len(self._buffer)
            if self._pending is None:
                self._pending = trio.Event()
                self._nursery.start_soon(self._read, self._pending)
            await self._pending.wait()
        if end < 0:
            if not self._buffer:
                return None
            end = len(self._buffer)
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
