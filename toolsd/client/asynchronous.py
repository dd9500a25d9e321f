"""The async client, for trio or asyncio (whichever runs it, found with sniffio): many calls at
once over one connection, each awaiting its reply."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from toolsd.client import copy
from toolsd.client.core import (
    CANCEL_SEND_S,
    CONNECT_WAIT_S,
    RECV_SIZE,
    ClientCore,
    ConnectionLost,
    Methods,
    connect_steps,
)
from toolsd.client.remote import (
    Target,
    check_certificate,
    hello_params,
    refused,
    resolve_target,
    tls_context,
)
from toolsd.wire.events import Event


class AsyncClient(Methods):
    """Async client for trio or asyncio (whichever runs it, found with sniffio).

    Several tasks may call at once: whoever waits reads, and hands other tasks their replies.
    Use `await AsyncClient.connect(url)` and `await client.aclose()` (or `async with`); the
    URL and its `token`, `fingerprint`, `cafile` are as for the blocking Client (a TLS one
    authenticates in `connect`; `server_hello` holds the daemon's hello).
    A call whose task is cancelled sends a `cancel` for its request, so what the request
    started (a shell.run's command, a repl.exec's code) is ended by the daemon, not left
    running until its timeout.
    """

    def __init__(self, backend: _Backend, target: Target):
        self.target = target
        self.socket_path = target.where
        self.server_hello: dict | None = None
        self._io = backend
        self._proto = ClientCore()
        self._send_lock = backend.lock()
        self._reading = False
        self._arrived = backend.event()

    @classmethod
    async def connect(cls, url: str | Target | None = None, *, token: str | None = None,
                      fingerprint: str | None = None,
                      cafile: str | None = None) -> AsyncClient:
        """Connected (and, over TLS, authenticated); `connect(client.target)` connects again
        to the same daemon with the same credentials."""
        target = resolve_target(url, token=token, fingerprint=fingerprint, cafile=cafile)
        client = cls(await _Backend.open(target), target)
        if target.tls:
            try:
                client.server_hello = await client.call("hello", **hello_params(target))
            except BaseException:
                await client.aclose()
                raise
        return client

    async def call(self, method: str, on_event: Callable[[Event], Any] | None = None,
                   **params: Any) -> Any:
        """The result of `method`. With `on_event`, the request asks for its events (1.1
        "stream": output as it comes) and `on_event(event)` is called with each, in order, in
        this task, before the result is returned; if it raises, the request is cancelled."""
        request_id = await self._send(method, params, stream=on_event is not None)
        try:
            while True:
                await self._wait(request_id)
                for event in self._proto.take_events(request_id):
                    on_event(event)
                if request_id in self._proto.replies:
                    break
        except BaseException:
            await self._abandon(request_id)
            raise
        return self._proto.take(request_id)

    def stream(self, method: str, **params: Any) -> StreamingCall:
        """The request's events (1.1 "stream") as an async iterator; its result afterwards::

            async with client.stream("shell.run", session=s, command="make") as call:
                async for event in call:
                    print(event.data, end="")
            result = call.result

        An error reply is raised by the iteration. Leaving the `async with` before the end
        cancels the request."""
        return StreamingCall(self, method, params)

    async def _send(self, method: str, params: dict, stream: bool = False) -> int:
        request_id, frame = self._proto.request(method, params, stream=stream)
        async with self._send_lock:
            await self._io.send_all(frame)
        return request_id

    async def _wait(self, request_id: int) -> None:
        """Until the request's reply or one of its events is in."""
        # One task at a time reads; after each chunk it wakes every waiter, and a waiter whose
        # reply is not in yet becomes the next reader if nobody is reading. So a reply that
        # came in someone else's chunk is never stuck behind a read for a slower request.
        while not self._proto.ready(request_id):
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

    async def _abandon(self, request_id: int) -> None:
        """The caller gave up on the request: a `cancel` for it, unless it was answered."""
        cancel = self._proto.abandon(request_id)
        if cancel is not None:
            await self._io.send_regardless(cancel, self._send_lock)

    async def upload(self, local: str, session: str, remote: str, **options: Any):
        """Copy a local file or folder into the session (client/copy.py; trio only)."""
        return await copy.upload(self, local, session, remote, **options)

    async def download(self, session: str, remote: str, local: str, **options: Any):
        """Copy a file or folder of the session here (client/copy.py; trio only)."""
        return await copy.download(self, session, remote, local, **options)

    async def aclose(self) -> None:
        await self._io.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class StreamingCall:
    """One streaming request of an AsyncClient (`AsyncClient.stream`): iterate its events;
    `result` holds its result once the iteration has ended."""

    def __init__(self, client: AsyncClient, method: str, params: dict):
        self._client = client
        self._method = method
        self._params = params
        self._id: int | None = None
        self._over = False
        self.result: Any = None

    def __aiter__(self) -> StreamingCall:
        return self

    async def __anext__(self) -> Event:
        client = self._client
        if self._over:
            raise StopAsyncIteration
        if self._id is None:
            self._id = await client._send(self._method, self._params, stream=True)
        try:
            await client._wait(self._id)
        except BaseException:
            await self.aclose()
            raise
        queue = client._proto.events.get(self._id)
        if queue:
            return queue.popleft()
        self._over = True
        self.result = client._proto.take(self._id)  # raises an error reply
        raise StopAsyncIteration

    async def aclose(self) -> None:
        """Cancel the request if it has not been answered (nothing if it was)."""
        if self._id is not None and not self._over:
            self._over = True
            await self._client._abandon(self._id)

    async def __aenter__(self) -> StreamingCall:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class _Backend:
    """The few I/O calls AsyncClient needs, for trio or asyncio."""

    @staticmethod
    async def open(target: Target) -> _Backend:
        import sniffio

        library = sniffio.current_async_library()
        if library == "trio":
            backend = _TrioBackend
        elif library == "asyncio":
            backend = _AsyncioBackend
        else:
            raise RuntimeError(f"AsyncClient supports trio and asyncio, not {library}")
        if target.tls:
            return await backend.open_tls(target)
        return await backend.open(target.where)

    @staticmethod
    async def connect(path: str, sleep) -> socket.socket:
        """connect_steps, pausing with the library's `sleep`. (Not the libraries' own connects:
        a full queue makes them hand back a socket that is not connected.)"""
        connecting = connect_steps(path, CONNECT_WAIT_S)
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

    @classmethod
    async def open_tls(cls, target: Target) -> _TrioBackend:
        import trio

        host = target.address.host
        try:
            tcp = await trio.open_tcp_stream(host, target.address.port)
        except OSError as e:
            raise refused(target, e) from None
        stream = trio.SSLStream(tcp, tls_context(target), server_hostname=host)
        try:
            try:
                await stream.do_handshake()
            except trio.BrokenResourceError as e:
                raise refused(target, e.__cause__ or e) from None
            check_certificate(target, stream.getpeercert(binary_form=True))
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        return cls(stream)

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
            return await self.stream.receive_some(RECV_SIZE)
        except (self._trio.BrokenResourceError, self._trio.ClosedResourceError):
            return b""

    async def send_regardless(self, data: bytes, lock) -> None:
        """Send while being cancelled (shielded, bounded); a closed connection is no error."""
        trio = self._trio
        with trio.CancelScope(shield=True), trio.move_on_after(CANCEL_SEND_S):
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

    @classmethod
    async def open_tls(cls, target: Target) -> _AsyncioBackend:
        import asyncio

        host = target.address.host
        try:
            reader, writer = await asyncio.open_connection(
                host, target.address.port, ssl=tls_context(target), server_hostname=host,
                limit=2**20)
        except OSError as e:
            raise refused(target, e) from None
        backend = cls(reader, writer)
        try:
            check_certificate(target, writer.get_extra_info("ssl_object").getpeercert(True))
        except BaseException:
            await backend.aclose()
            raise
        return backend

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
            return await self.reader.read(RECV_SIZE)
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
