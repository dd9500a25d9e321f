"""file.watch through a real daemon: the changes a session's commands make come as events; a
flood that the client does not read ends in a bounded `dropped` count, not in memory."""

from __future__ import annotations

import os
import socket
import struct

import msgspec
import psutil
import pytest
import trio

pytestmark = pytest.mark.daemon(shared=True)


async def next_event(events, wait_s: float = 10.0):
    """The next event, or None if none came within `wait_s` (a safety net, not a timing
    check: callers wait for a particular event)."""
    with trio.move_on_after(wait_s):
        return await events.receive()
    return None


async def until(events, kind: str, suffix: str, seen: list):
    while True:
        event = await next_event(events, 30)
        assert event is not None, f"no {kind} event for {suffix}; saw {seen}"
        seen.append((event.kind, event.path, event.to))
        if event.kind == kind and event.path.endswith(suffix):
            return event


async def test_watch_reports_create_modify_move_remove_made_by_shell_run(daemon):
    client = await daemon.async_client()
    ws = daemon.workspace
    os.makedirs(os.path.join(ws, "w"))
    session = (await client.session_open(ws))["session"]
    seen: list = []
    send, events = trio.open_memory_channel(1000)
    final = {}

    async def watch():
        # The stream in a task of its own: a timeout on a read must not cancel the watch.
        async with client.stream("file.watch", session=session, path="w") as call:
            async for event in call:
                await send.send(event)
        final.update(call.result)
        await send.aclose()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            # The watch starts in the helper a moment after the request: touch a marker
            # until its event shows the watch is on.
            for attempt in range(20):
                await client.shell_run(session, f"touch w/ready{attempt}")
                event = await next_event(events, 2)
                if event is not None:
                    break
            assert event is not None and event.kind == "created", event
            await client.shell_run(session, "mkdir w/sub")
            await until(events, "created", "/w/sub", seen)
            await client.shell_run(session, "echo one > w/sub/f")
            await until(events, "created", "/w/sub/f", seen)
            await until(events, "modified", "/w/sub/f", seen)
            await client.shell_run(session, "echo two >> w/sub/f")
            await until(events, "modified", "/w/sub/f", seen)
            await client.shell_run(session, "mv w/sub/f w/sub/g")
            moved = await until(events, "moved", "/w/sub/f", seen)
            assert moved.to == os.path.join(ws, "w/sub/g")
            await client.shell_run(session, "mv w/sub w/renamed && echo 3 >> w/renamed/g")
            await until(events, "moved", "/w/sub", seen)
            # Below a moved folder, paths carry its new name.
            await until(events, "modified", "/w/renamed/g", seen)
            await client.shell_run(session, "rm w/renamed/g")
            await until(events, "removed", "/w/renamed/g", seen)
            # Removing the watched folder ends the watch with its final reply.
            await client.shell_run(session, "rm -r w")
            async for _event in events:
                pass
        assert final["dropped"] == 0
        assert final["events"] >= len(seen) + 1
    finally:
        await client.session_close(session)
        await client.aclose()


async def test_watch_of_a_hidden_or_missing_folder_is_not_found(daemon):
    client = await daemon.async_client()
    session = (await client.session_open(daemon.workspace))["session"]
    try:
        for path in ("missing", daemon.state_dir):
            with pytest.raises(Exception) as e:
                async with client.stream("file.watch", session=session, path=path) as call:
                    async for _event in call:
                        pass
            assert getattr(e.value, "code", None) == "not_found", e.value
    finally:
        await client.session_close(session)
        await client.aclose()


_encode = msgspec.msgpack.encode
_decode = msgspec.msgpack.decode


def frame(body: dict) -> bytes:
    data = _encode(body)
    return struct.pack(">I", len(data)) + data


class Frames:
    """Frames read off a raw socket; a timeout leaves what was read for the next call."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = b""

    def next(self, timeout: float | None = None) -> dict | None:
        self.sock.settimeout(timeout)
        while not (len(self.buf) >= 4
                   and len(self.buf) >= 4 + struct.unpack(">I", self.buf[:4])[0]):
            try:
                data = self.sock.recv(1 << 16)
            except (socket.timeout, TimeoutError):
                return None
            assert data, "the daemon closed the connection"
            self.buf += data
        n = struct.unpack(">I", self.buf[:4])[0]
        body, self.buf = _decode(self.buf[4:4 + n]), self.buf[4 + n:]
        return body


def test_flood_that_nobody_reads_ends_in_a_bounded_dropped_count(daemon, client, session):
    """100,000 changes while the watching client reads nothing: the daemon's memory stays
    flat, and when the watch is cancelled its reply counts what was sent and dropped."""
    watcher = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    watcher.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
    watcher.connect(daemon.socket)
    proc = psutil.Process(daemon.proc.pid)
    try:
        watcher.sendall(frame({"id": 1, "method": "file.watch",
                               "params": {"session": session, "path": ".", "stream": True}}))
        # On once an event of ours is seen (read it; then read nothing more).
        frames = Frames(watcher)
        for attempt in range(50):
            client.shell_run(session, f"touch ready{attempt}")
            first = frames.next(timeout=2)
            if first is not None:
                break
        assert first is not None and first.get("event") == "file", first
        before = proc.memory_info().rss
        result = client.shell_run(
            session, "for i in $(seq 50000); do echo x >> a; echo x >> b; done",
            timeout_s=600)
        assert result["exit_code"] == 0, result["output"]
        grown = proc.memory_info().rss - before
        watcher.sendall(frame({"id": 2, "method": "cancel", "params": {"request": 1}}))
        events, reply = 1, None
        while (body := frames.next()) is not None:
            if body.get("event") == "file":
                events += 1
            elif body.get("id") == 1:
                reply = body
                break
        assert "result" in reply, reply
        assert reply["result"]["events"] == events
        assert reply["result"]["dropped"] > 0
        # Everything is accounted for, within what the flood made: at most two events per
        # change (a write's own and its file's close), counted once each.
        assert events + reply["result"]["dropped"] <= 2 * 100_000 + 100
        assert grown < 64 * 1024 * 1024, f"the daemon grew by {grown} bytes"
    finally:
        watcher.close()
