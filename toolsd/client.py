"""Clients of the toolsd daemon: a blocking `Client` and an `AsyncClient` for trio or asyncio.

The logic without I/O (request ids and frames, reading replies, mapping errors to exceptions)
lives once in `_Protocol`; the two clients only move bytes. Exceptions::

    ToolsdError (code, message)        every error reply, and:
     └── ConnectionLost                the daemon closed the connection or could not be reached

`call(method, **params)` returns the result map. The named helpers (`shell_run`, ...) are the
same call with the contract's names; on AsyncClient they are awaited.

Connecting: when the daemon's queue of connections waiting to be accepted is full (a burst of
clients, or a daemon that does not accept), the kernel refuses a connect at once (EAGAIN). Both
clients then try again, with short pauses, for up to CONNECT_WAIT_S (a blocking Client with a
shorter `timeout`: that long), and raise ConnectionLost saying so if the queue stays full.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Generator
from typing import Any

import msgspec

from toolsd.wire.framing import FrameReader, encode_frame
from toolsd.wire.paths import resolve_socket_path
from toolsd.wire.protocol import DEFAULT_MAX_FRAME, ToolsdError

__all__ = ["Client", "AsyncClient", "ToolsdError", "ConnectionLost", "CONNECT_WAIT_S"]

log = logging.getLogger("toolsd.client")

# How long a connect keeps trying while the daemon's queue of waiting connections is full.
CONNECT_WAIT_S = 5.0
# Pauses between those tries: doubling from the first to the last.
_RETRY_FIRST_S = 0.001
_RETRY_MAX_S = 0.05


class ConnectionLost(ToolsdError):
    def __init__(self, message: str):
        super().__init__("connection_lost", message)


class _Reply(msgspec.Struct):
    id: int
    result: Any = None
    error: dict | None = None


# At most this per read: more costs an mmap and a munmap per read in some processes (see
# toolsd/fdio.py; not imported from there, as this module does without trio).
_RECV_SIZE = 64 * 1024
# How long a cancelled call may wait to send its `cancel` (the daemon not reading).
_CANCEL_SEND_S = 5.0
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_Reply)


class _Protocol:
    """Frames out, replies in; no I/O."""

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME):
        self._next_id = 0
        self.reader = FrameReader(max_frame)
        self.replies: dict[int, _Reply] = {}
        self._abandoned: set[int] = set()  # ids whose replies nobody waits for

    def request(self, method: str, params: dict) -> tuple[int, bytes]:
        self._next_id += 1
        body = _encoder.encode({"id": self._next_id, "method": method, "params": params})
        return self._next_id, encode_frame(body)

    def feed(self, data: bytes) -> None:
        if not data:
            raise ConnectionLost("toolsd closed the connection")
        for frame in self.reader.feed(data):
            reply = _decoder.decode(frame)
            if reply.id == 0 and reply.error is not None:
                # A connection-level refusal (bad_frame, frame_too_large): the daemon closes.
                raise _to_error(reply.error)
            if reply.id in self._abandoned:
                self._abandoned.discard(reply.id)
                continue
            self.replies[reply.id] = reply

    def abandon(self, request_id: int) -> bytes | None:
        """The caller gave up waiting for `request_id`: its reply will be dropped. Returns the
        frame of a `cancel` for it (itself abandoned), or None if its reply was already in."""
        if self.replies.pop(request_id, None) is not None:
            return None
        self._abandoned.add(request_id)
        cancel_id, frame = self.request("cancel", {"request": request_id})
        self._abandoned.add(cancel_id)
        return frame

    def take(self, request_id: int) -> Any:
        reply = self.replies.pop(request_id)
        if reply.error is not None:
            raise _to_error(reply.error)
        return reply.result


def _connect(path: str, wait_s: float) -> Generator[float, None, socket.socket]:
    """Connect a non-blocking socket to `path`: yields the pauses to make (the caller sleeps,
    blocking or awaiting) while the daemon's queue is full, returns the connected socket, and
    raises ConnectionLost when it cannot connect. Closing the generator closes the socket."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    deadline = time.monotonic() + wait_s
    pause = _RETRY_FIRST_S
    try:
        while True:
            try:
                # A Unix socket connects at once or not at all: no EINPROGRESS to wait out.
                sock.connect(path)
                return sock
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ConnectionLost(
                        f"toolsd at {path} accepted no connection for {wait_s:g} s: its queue "
                        f"of connections waiting to be accepted stayed full (too many clients "
                        f"connecting at once, or the daemon is stuck); try again later, or "
                        f"check it with `toolsd status`") from None
                if pause == _RETRY_FIRST_S:
                    log.info("toolsd at %s has a full queue of connections; trying again for "
                             "up to %g s", path, wait_s)
                yield min(pause, left)
                pause = min(pause * 2, _RETRY_MAX_S)
    except OSError as e:
        sock.close()
        raise ConnectionLost(f"cannot reach toolsd at {path} ({e.strerror}); is it running? "
                             f"start it with `toolsd serve`") from None
    except BaseException:
        sock.close()
        raise


def _to_error(error: dict) -> ToolsdError:
    return ToolsdError(str(error.get("code", "internal")), str(error.get("message", "")))


def _params(**params: Any) -> dict:
    return {k: v for k, v in params.items() if v is not None}


class _Methods:
    """The contract's methods by name; `call` is the shell's (blocking or awaitable)."""

    def call(self, method: str, **params: Any):  # pragma: no cover - overridden
        raise NotImplementedError

    def hello(self, client: str = "toolsd-client"):
        return self.call("hello", client=client)

    def session_open(self, workspace: str, **options: Any):
        return self.call("session.open", workspace=workspace, **options)

    def session_close(self, session: str):
        return self.call("session.close", session=session)

    def session_list(self):
        return self.call("session.list")

    def turn_begin(self, session: str):
        return self.call("turn.begin", session=session)

    def turn_end(self, session: str, turn: str):
        return self.call("turn.end", session=session, turn=turn)

    def shell_run(self, session: str, command: str, **options: Any):
        return self.call("shell.run", session=session, command=command, **options)

    def repl_exec(self, session: str, turn: str, code: str, **options: Any):
        return self.call("repl.exec", session=session, turn=turn, code=code, **options)

    def process_start(self, session: str, command: str, **options: Any):
        return self.call("process.start", session=session, command=command, **options)

    def process_output(self, id: str, **options: Any):
        return self.call("process.output", id=id, **options)

    def process_stop(self, id: str, **options: Any):
        return self.call("process.stop", id=id, **options)

    def process_list(self, session: str | None = None):
        return self.call("process.list", **_params(session=session))

    def image_read(self, session: str, path: str, **options: Any):
        return self.call("image.read", session=session, path=path, **options)


class Client(_Methods):
    """Blocking client; one request at a time (use one Client per thread)."""

    def __init__(self, socket_path: str | None = None, *, timeout: float | None = None):
        self.socket_path = resolve_socket_path(socket_path)
        self._proto = _Protocol()
        connecting = _connect(self.socket_path, CONNECT_WAIT_S if timeout is None
                              else min(timeout, CONNECT_WAIT_S))
        try:
            while True:
                time.sleep(next(connecting))
        except StopIteration as connected:
            self._sock = connected.value
        finally:
            connecting.close()
        self._sock.settimeout(timeout)

    def call(self, method: str, **params: Any) -> Any:
        request_id, frame = self._proto.request(method, params)
        try:
            self._sock.sendall(frame)
            while request_id not in self._proto.replies:
                self._proto.feed(self._sock.recv(_RECV_SIZE))
        except OSError as e:  # includes the timeout given to the constructor
            raise ConnectionLost(f"no answer from toolsd at {self.socket_path} ({e})") from None
        return self._proto.take(request_id)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_Methods):
    """Async client for trio or asyncio (whichever runs it, found with sniffio).

    Several tasks may call at once: whoever waits reads, and hands other tasks their replies.
    Use `await AsyncClient.connect(path)` and `await client.aclose()` (or `async with`).
    A call whose task is cancelled sends a `cancel` for its request, so what the request
    started (a shell.run's command, a repl.exec's code) is ended by the daemon, not left
    running until its timeout.
    """

    def __init__(self, backend: _Backend, socket_path: str):
        self.socket_path = socket_path
        self._io = backend
        self._proto = _Protocol()
        self._send_lock = backend.lock()
        self._reading = False
        self._arrived = backend.event()

    @classmethod
    async def connect(cls, socket_path: str | None = None) -> AsyncClient:
        path = resolve_socket_path(socket_path)
        backend = await _Backend.open(path)
        return cls(backend, path)

    async def call(self, method: str, **params: Any) -> Any:
        request_id, frame = self._proto.request(method, params)
        async with self._send_lock:
            await self._io.send_all(frame)
        # One task at a time reads; after each chunk it wakes every waiter, and a waiter whose
        # reply is not in yet becomes the next reader if nobody is reading. So a reply that
        # came in someone else's chunk is never stuck behind a read for a slower request.
        try:
            while request_id not in self._proto.replies:
                if self._reading:
                    await self._arrived.wait()
                    continue
                self._reading = True
                try:
                    self._proto.feed(await self._io.receive_some())
                finally:
                    self._reading = False
                    arrived, self._arrived = self._arrived, self._io.event()
                    arrived.set()
        except BaseException:
            cancel = self._proto.abandon(request_id)
            if cancel is not None:
                await self._io.send_regardless(cancel, self._send_lock)
            raise
        return self._proto.take(request_id)

    async def aclose(self) -> None:
        await self._io.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class _Backend:
    """The few I/O calls AsyncClient needs, for trio or asyncio."""

    @staticmethod
    async def open(path: str) -> _Backend:
        import sniffio

        library = sniffio.current_async_library()
        if library == "trio":
            return await _TrioBackend.open(path)
        if library == "asyncio":
            return await _AsyncioBackend.open(path)
        raise RuntimeError(f"AsyncClient supports trio and asyncio, not {library}")

    @staticmethod
    async def connect(path: str, sleep) -> socket.socket:
        """_connect, pausing with the library's `sleep`. (Not the libraries' own connects:
        a full queue makes them hand back a socket that is not connected.)"""
        connecting = _connect(path, CONNECT_WAIT_S)
        try:
            while True:
                await sleep(next(connecting))
        except StopIteration as connected:
            return connected.value
        finally:
            connecting.close()


class _TrioBackend(_Backend):
    def __init__(self, stream):
        import trio

        self._trio = trio
        self.stream = stream

    @classmethod
    async def open(cls, path: str) -> _TrioBackend:
        import trio

        sock = await _Backend.connect(path, trio.sleep)
        return cls(trio.SocketStream(trio.socket.from_stdlib_socket(sock)))

    def lock(self):
        return self._trio.Lock()

    def event(self):
        return self._trio.Event()

    async def send_all(self, data: bytes) -> None:
        try:
            await self.stream.send_all(data)
        except (self._trio.BrokenResourceError, self._trio.ClosedResourceError) as e:
            raise ConnectionLost(f"toolsd closed the connection ({e})") from None

    async def receive_some(self) -> bytes:
        try:
            return await self.stream.receive_some(_RECV_SIZE)
        except (self._trio.BrokenResourceError, self._trio.ClosedResourceError):
            return b""

    async def send_regardless(self, data: bytes, lock) -> None:
        """Send while being cancelled (shielded, bounded); a closed connection is no error."""
        trio = self._trio
        with trio.CancelScope(shield=True), trio.move_on_after(_CANCEL_SEND_S):
            try:
                async with lock:
                    await self.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    async def aclose(self) -> None:
        await self.stream.aclose()


class _AsyncioBackend(_Backend):
    def __init__(self, reader, writer):
        import asyncio

        self._asyncio = asyncio
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, path: str) -> _AsyncioBackend:
        import asyncio

        sock = await _Backend.connect(path, asyncio.sleep)
        try:
            return cls(*await asyncio.open_unix_connection(sock=sock, limit=2**20))
        except BaseException:
            sock.close()
            raise

    def lock(self):
        return self._asyncio.Lock()

    def event(self):
        return self._asyncio.Event()

    async def send_all(self, data: bytes) -> None:
        try:
            self.writer.write(data)
            await self.writer.drain()
        except (ConnectionError, OSError) as e:
            raise ConnectionLost(f"toolsd closed the connection ({e})") from None

    async def receive_some(self) -> bytes:
        try:
            return await self.reader.read(_RECV_SIZE)
        except (ConnectionError, OSError):
            return b""

    async def send_regardless(self, data: bytes, lock) -> None:
        """Send while being cancelled: a write is buffered at once (no await), so it is whole
        and in order whatever holds the lock; a closed connection is no error."""
        try:
            self.writer.write(data)
        except (ConnectionError, OSError, RuntimeError):
            pass

    async def aclose(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
