"""Bytes carried both ways between a session's connection and the one made for it, with
back-pressure: one chunk in flight per direction, never a whole stream in memory."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from toolsd.sandbox.egress.connlog import Entry

CHUNK = 128 * 1024
_GONE = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


async def relay(client: trio.abc.HalfCloseableStream, server: trio.abc.HalfCloseableStream,
                entry: Entry, first: bytes = b"",
                check: Callable[[bytes], Awaitable[bytes | None]] | None = None) -> None:
    """Carry bytes until the server's side ends (then the exchange is over) or either side
    fails. `first`: bytes the client sent already. `check(data)`, if given, sees the client's
    first bytes before any reach the server: it returns them (and more it read) to send, or
    None to end the connection; the server's bytes flow meanwhile, so a protocol in which
    the server speaks first is not held up."""
    async with trio.open_nursery() as nursery:
        async def upstream() -> None:
            data = first
            try:
                if check is not None:
                    data = await check(data)
                    if data is None:
                        nursery.cancel_scope.cancel()
                        return
                while True:
                    if data:
                        await server.send_all(data)
                        entry.sent += len(data)
                    data = await client.receive_some(CHUNK)
                    if not data:
                        break
                await server.send_eof()  # the client is done sending; answers still come
            except _GONE:
                nursery.cancel_scope.cancel()

        async def downstream() -> None:
            try:
                while data := await server.receive_some(CHUNK):
                    await client.send_all(data)
                    entry.received += len(data)
            except _GONE:
                pass
            nursery.cancel_scope.cancel()

        nursery.start_soon(upstream)
        nursery.start_soon(downstream)
