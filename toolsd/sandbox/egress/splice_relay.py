"""Bytes carried both ways between a session's connection and the one made for it, with
back-pressure: at most one pipe's worth in flight per direction, never a whole stream in
memory. The bytes move socket to pipe to socket in the kernel (splice), never through the
daemon's memory; a copy loop where splice is missing."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Awaitable, Callable

import trio

from toolsd.sandbox.egress.connlog import LoggedConnection

CHUNK = 256 * 1024  # a pipe of this size per direction: what one connection holds
_GONE = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
_SPLICE = getattr(os, "splice", None)
_FLAGS = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)
F_SETPIPE_SZ = 1031
YIELD_EVERY = 8 << 20


async def relay(client: trio.SocketStream, server: trio.SocketStream,
                entry: LoggedConnection, first: bytes = b"",
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
                if data:
                    await server.send_all(data)
                    entry.sent += len(data)
                await pump(client, server, entry, "sent")
                await server.send_eof()  # the client is done sending; answers still come
            except _GONE:
                nursery.cancel_scope.cancel()

        async def downstream() -> None:
            try:
                await pump(server, client, entry, "received")
            except _GONE:
                pass
            nursery.cancel_scope.cancel()

        nursery.start_soon(upstream)
        nursery.start_soon(downstream)


async def pump(src: trio.SocketStream, dst: trio.SocketStream, entry: LoggedConnection,
               count: str) -> None:
    """Everything `src` sends, to `dst`, until `src` ends."""
    if _SPLICE is None:
        while data := await src.receive_some(CHUNK):
            await dst.send_all(data)
            setattr(entry, count, getattr(entry, count) + len(data))
        return
    source, sink = src.socket.fileno(), dst.socket.fileno()
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        try:
            fcntl.fcntl(w, F_SETPIPE_SZ, CHUNK)
        except OSError:
            pass  # the default pipe size, past the user's pipe-buffer quota
        # Two tasks around the pipe, so that reading goes on while the sink is full and
        # writing while the source is empty: the pipe is the only buffer, in the kernel.
        held = [0]  # bytes in the pipe

        async def fill() -> None:
            moved = 0
            while True:
                try:
                    got = _SPLICE(source, w, CHUNK, flags=_FLAGS)
                except BlockingIOError:
                    if held[0] >= CHUNK:
                        await trio.lowlevel.wait_writable(w)
                    else:
                        await trio.lowlevel.wait_readable(source)
                    continue
                if got == 0:
                    return
                held[0] += got
                moved += got
                if moved >= YIELD_EVERY:  # a stream that never waits yields to others
                    moved = 0
                    await trio.lowlevel.checkpoint()

        async def drain(ended: trio.Event) -> None:
            while True:
                if held[0] == 0:
                    if ended.is_set():
                        return
                    await trio.lowlevel.wait_readable(r)
                    continue
                try:
                    put = _SPLICE(r, sink, held[0], flags=_FLAGS)
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(sink)
                    continue
                held[0] -= put
                setattr(entry, count, getattr(entry, count) + put)

        ended = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain, ended)
            try:
                await fill()
            finally:
                ended.set()
                os.close(w)  # the drain's wait on the pipe sees its end
                w = -1
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
