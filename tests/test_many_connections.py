"""Hundreds of clients connecting in the same moment: none is refused because the daemon's
queue of connections waiting to be accepted is full. The client library (blocking, trio and
asyncio) tries again while the queue is full, and says so clearly if it stays full."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import msgspec
import pytest
import trio

from conftest import short_tempdir
from toolsd.client import AsyncClient, Client, ConnectionLost
from toolsd.wire.framing import FrameReader, encode_frame

pytestmark = pytest.mark.daemon(shared=True)

CONNECTIONS = 600


class RetryLog(logging.Handler):
    """Counts the client library's "full queue, trying again" records, and wakes a waiter once
    `want` clients have either said so, or connected, or failed: then each has tried at least
    once."""

    def __init__(self, want: int):
        super().__init__()
        self.want = want
        self.retrying = 0
        self.done = 0
        self.counting = threading.Lock()
        self.all_tried = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "full queue" in record.getMessage():
            self._count("retrying")

    def connected_or_failed(self) -> None:
        self._count("done")

    def _count(self, what: str) -> None:
        with self.counting:
            setattr(self, what, getattr(self, what) + 1)
            if self.retrying + self.done >= self.want:
                self.all_tried.set()


@pytest.fixture
def retry_log():
    handlers = []

    def make(want: int) -> RetryLog:
        handler = RetryLog(want)
        handlers.append(handler)
        logging.getLogger("toolsd.client").addHandler(handler)
        return handler

    logger = logging.getLogger("toolsd.client")
    level = logger.level
    logger.setLevel(logging.INFO)
    yield make
    for handler in handlers:
        logger.removeHandler(handler)
    logger.setLevel(level)


def stopped(pid: int):
    """SIGSTOP `pid` until the returned function is called (SIGCONT); also on failure."""
    os.kill(pid, signal.SIGSTOP)
    return lambda: os.kill(pid, signal.SIGCONT)


def test_600_connections_in_a_burst_all_connect_and_are_answered(daemon, retry_log):
    # The daemon is stopped while every client connects: they all meet a queue nobody empties,
    # as when a burst outpaces the daemon's accepting.
    log = retry_log(CONNECTIONS)
    clients: list[Client] = []

    def connect_and_hello() -> int:
        try:
            client = Client(daemon.socket, timeout=60)
        finally:
            log.connected_or_failed()
        clients.append(client)
        return client.hello()["protocol"]

    resume = stopped(daemon.proc.pid)
    try:
        with ThreadPoolExecutor(max_workers=CONNECTIONS) as pool:
            futures = [pool.submit(connect_and_hello) for _ in range(CONNECTIONS)]
            assert log.all_tried.wait(60)
            resume()
            results = [f.result() for f in futures]
    finally:
        resume()
        for client in clients:
            client.close()
    assert results == [1] * CONNECTIONS


async def test_600_async_clients_at_once_are_all_answered(daemon):
    answers = []

    async def one():
        async with await AsyncClient.connect(daemon.socket) as client:
            answers.append((await client.hello())["protocol"])

    async with trio.open_nursery() as nursery:
        for _ in range(CONNECTIONS):
            nursery.start_soon(one)
    assert answers == [1] * CONNECTIONS


@pytest.fixture
def full_listener():
    """A stand-in for a daemon whose queue of waiting connections is full (nobody accepts):
    yields (path, serve), `serve(n)` accepting what is queued and answering the `hello` of
    the `n` clients after it with the `client` name each gave."""
    root = short_tempdir()
    path = os.path.join(root, "full.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    queued = []
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(path)
        except BlockingIOError:
            s.close()
            break
        queued.append(s)

    def serve(count: int) -> None:
        for _ in queued:
            listener.accept()[0].close()
        for _ in range(count):
            conn, _addr = listener.accept()
            with conn:
                frames = FrameReader(1 << 20)
                while not (got := frames.feed(conn.recv(4096))):
                    pass
                request = msgspec.msgpack.decode(got[0])
                reply = {"id": request["id"], "result": {"client": request["params"]["client"]}}
                conn.sendall(encode_frame(msgspec.msgpack.encode(reply)))

    yield path, serve
    for s in (*queued, listener):
        s.close()
    shutil.rmtree(root, ignore_errors=True)


def test_a_full_queue_is_tried_again_until_there_is_room(full_listener, retry_log):
    path, serve = full_listener
    log = retry_log(3)

    def blocking():
        with Client(path, timeout=60) as c:
            return c.hello("blocking")["client"]

    def with_trio():
        async def main():
            async with await AsyncClient.connect(path) as c:
                return (await c.hello("trio"))["client"]
        return trio.run(main)

    def with_asyncio():
        async def main():
            async with await AsyncClient.connect(path) as c:
                return (await c.hello("asyncio"))["client"]
        return asyncio.run(main())

    def counted(connect_and_hello):
        def run():
            try:
                return connect_and_hello()
            except BaseException:
                log.connected_or_failed()  # so that the test fails here, not after a wait
                raise
        return run

    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = [pool.submit(counted(f)) for f in (blocking, with_trio, with_asyncio)]
        assert log.all_tried.wait(60)
        assert log.retrying == 3  # the queue was full when each of them first tried
        serve(3)
        answers = sorted(f.result() for f in futures)
    assert answers == ["asyncio", "blocking", "trio"]


def test_a_queue_that_stays_full_gives_a_clear_error(full_listener):
    path, _serve = full_listener
    with pytest.raises(ConnectionLost) as e:
        Client(path, timeout=0.5)
    assert "queue" in e.value.message and "full" in e.value.message
    assert path in e.value.message
