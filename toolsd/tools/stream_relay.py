"""Carrying bytes both ways between two connected streams (port.forward's connections), with
back-pressure: at most CHUNK bytes of each direction are held here at any time, so a side
that does not read slows the other through the kernel's socket buffers, never by growing the
daemon's memory."""

from __future__ import annotations

import trio

CHUNK = 64 * 1024


async def relay(a: trio.SocketStream, b: trio.SocketStream) -> None:
    """Until both directions have ended. End of file on one side is passed on as a
    half-close (shutdown for writing) of the other, as a direct connection would see it; a
    broken side (reset, closed) ends both at once. The streams stay the caller's to close."""
    async with trio.open_nursery() as nursery:
        async def one_way(src: trio.SocketStream, dst: trio.SocketStream) -> None:
            try:
                while data := await src.receive_some(CHUNK):
                    await dst.send_all(data)
                await dst.send_eof()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                nursery.cancel_scope.cancel()

        nursery.start_soon(one_way, a, b)
        nursery.start_soon(one_way, b, a)
