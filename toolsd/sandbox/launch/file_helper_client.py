"""Host side of a session's file helper (driver/file_helper.py, where the frames are described):
started through the launcher on first use, one stream socket, requests matched to replies by
id, a watch's events handed to its callback as they come.

Resource handling: a FileHelper belongs to its Session. Its socket and its reader task live in
the session's nursery (`start_soon`), so they end with the session; the helper itself is a
process of the sandbox, which ends with the sandbox. A helper that dies (killed from inside
the session) fails the calls in flight with io_error; the next call starts a new one.

What comes out of the helper is not trusted: every header is decoded into a Struct, lengths
are checked before anything is read, a malformed frame ends that helper.
"""

from __future__ import annotations

import array
import collections
import itertools
import logging
import os
import signal
import socket
import stat
import struct
import sys
from collections.abc import Callable, Mapping

import msgspec
import trio

from driver import FILE_HELPER_PY
from toolsd.runtime import threads
from toolsd.runtime.child_fds import ChildFds
from toolsd.sandbox.errors import Fault, SandboxError
from toolsd.sandbox.bwrap.mount_plan import plan_mounts
from toolsd.sandbox.bwrap.policy import Policy

__all__ = ["FileHelper", "MAX_READ"]

log = logging.getLogger("toolsd.files")

HEADER = struct.Struct(">II")
MAX_READ = 8 << 20  # the most one read's data may be (driver/_file_ops.py MAX_READ)
MAX_HEADER = 8 << 20  # a listing's header is the largest (its LIST_BUDGET, and room)
START_TIMEOUT_S = 30.0
# A send to a helper that takes no data for this long: the helper is stuck (a hung mount?),
# and is killed, failing what it was doing.
SEND_TIMEOUT_S = 60.0
# The codes of the helper's error replies (driver/_file_view.py FileError), by fault.
_FAULTS = {"not_found": Fault.NOT_FOUND, "io_error": Fault.IO,
           "limit_exceeded": Fault.LIMIT, "bad_params": Fault.REFUSED}
_RECV = 1 << 16
READ_SLOTS = 4
MAX_FDS_QUEUED = 64


class _Error(msgspec.Struct):
    code: str
    message: str


class _HelperReply(msgspec.Struct):
    id: int
    ok: dict | None = None
    error: _Error | None = None
    events: list[tuple[str, str, str | None]] | None = None  # a watch's
    dropped: int = 0
    started: bool = False


_decode_reply = msgspec.json.Decoder(_HelperReply).decode
_encode = msgspec.json.Encoder().encode


class _Waiter:
    __slots__ = ("done", "reply", "data", "on_events", "fd")

    def __init__(self, on_events: Callable[[list, int, bool], None] | None = None):
        self.done = trio.Event()
        self.reply: _HelperReply | None = None
        self.data = b""
        self.on_events = on_events  # a watch's: called with each batch; never awaits
        self.fd: int | None = None  # a file the helper opened for us to read (see _read_fd)


class FileHelper:
    def __init__(self, *, workspace: str, policy: Policy, file_limit: int,
                 env: Mapping[str, str]):
        self._workspace = workspace
        self._policy = policy
        self._file_limit = file_limit
        self._env = dict(env)
        self._sock: socket.socket | None = None
        self._pidfd: int | None = None
        self._ids = itertools.count(1)
        self._waiters: dict[int, _Waiter] = {}
        self._start_lock = trio.Lock()
        self._send_lock = trio.Lock()
        self._why_gone = ""
        self._fds: collections.deque[int] = collections.deque()  # received, not yet claimed
        # Reads whose data the daemon may hold at once (each up to MAX_READ): the rest wait.
        self.read_slots = trio.Semaphore(READ_SLOTS)

    @classmethod
    def of_session(cls, session) -> FileHelper:
        return cls(workspace=session.workspace, policy=session.policy,
                   file_limit=session.limits.file_mb << 20, env=session.env)

    def _config(self) -> dict:
        plan = plan_mounts(self._policy)
        return {"op": "config", "id": 0, "workspace": self._workspace,
                "hidden": [*plan.hidden_dirs, *plan.hidden_files],
                "outer_hidden": list(plan.outer_hidden_dirs),
                "file_limit": self._file_limit}

    # ------------------------------------------------------------ start

    @property
    def running(self) -> bool:
        return self._sock is not None

    def start_in_background(self, launcher, start_soon) -> None:
        """Start the helper in a task of the session, unless it runs or is starting: for a
        caller that can do without it this time (image.read). A failure is only logged; the
        next call that needs the helper tries again."""
        if self._sock is not None or self._start_lock.locked():
            return

        async def start() -> None:
            try:
                await self._ensure(launcher, start_soon)
            except Exception as e:
                log.debug("the file helper did not start in the background: %s", e)

        start_soon(start)

    async def _ensure(self, launcher, start_soon) -> socket.socket:
        if self._sock is not None:
            return self._sock
        async with self._start_lock:
            if self._sock is None:
                await self._start(launcher, start_soon)
            return self._sock

    async def _start(self, launcher, start_soon) -> None:
        with ChildFds() as fds:
            ours, theirs = fds.socketpair()
            await launcher.start_helper([sys.executable, "-I", "-S", FILE_HELPER_PY, "3"],
                                        self._env, theirs.fileno())
        ours.setblocking(False)
        hello = self._waiters[0] = _Waiter()
        self._sock = ours
        self._why_gone = ""
        start_soon(self._read_loop, ours)
        try:
            await self._send(ours, self._config())
            with trio.move_on_after(START_TIMEOUT_S):
                await hello.done.wait()
        finally:
            self._waiters.pop(0, None)
        if hello.reply is None or hello.reply.ok is None:
            self._gone(ours, self._why_gone or "it did not start")
            raise SandboxError(Fault.UNAVAILABLE, f"the session's file helper did not start "
                               f"({self._why_gone or 'no answer'}); the daemon log may say why")

    # ------------------------------------------------------------ calls

    async def call(self, launcher, start_soon, meta: dict, data: bytes = b"",
                   on_events: Callable[[list, int, bool], None] | None = None,
                   on_sent: Callable[[int], None] | None = None) -> tuple[dict, bytes]:
        """(result, data) of one request to the helper; SandboxError for its error reply,
        or Fault.IO if the helper died meanwhile. With `on_events` (a watch), its batches of
        events go there, `on_events(events, dropped so far, started)`, until the final
        reply; `on_sent(id)` once the request is out (the id `stop_watch` takes)."""
        sock = await self._ensure(launcher, start_soon)
        rid = next(self._ids)
        waiter = self._waiters[rid] = _Waiter(on_events)
        try:
            await self._send(sock, {**meta, "id": rid}, data)
            if on_sent is not None:
                on_sent(rid)
            await waiter.done.wait()
        finally:
            self._waiters.pop(rid, None)
        reply = waiter.reply
        if reply is None:
            raise SandboxError(Fault.IO, f"the session's file helper ended during the call "
                               f"({self._why_gone or 'killed'}); try again")
        if reply.error is not None:
            raise SandboxError(_FAULTS.get(reply.error.code, Fault.IO), reply.error.message)
        if reply.ok is not None and reply.ok.get("fd") is True:
            if waiter.fd is None:
                raise SandboxError(Fault.IO, "the session's file helper answered a read "
                                   "without its file; try again")
            return await _read_fd(waiter.fd, reply.ok, int(meta.get("offset") or 0),
                                  min(int(meta.get("length") or MAX_READ), MAX_READ))
        return reply.ok or {}, waiter.data

    async def stop_watch(self, rid: int) -> None:
        sock = self._sock
        if sock is not None and rid in self._waiters:
            await self._send(sock, {"op": "unwatch", "id": next(self._ids), "watch": rid})

    async def _send(self, sock: socket.socket, meta: dict, data: bytes = b"") -> None:
        head = _encode(meta)
        frame = HEADER.pack(len(head), len(data)) + head
        if data and len(data) <= _RECV:
            frame, data = frame + data, b""
        async with threads.held(self._send_lock):
            # A frame the socket takes whole at once (the usual case) needs neither the
            # shield nor the timer: each scope costs more than such a send.
            try:
                sent = sock.send(frame)
            except BlockingIOError:
                sent = 0
            except OSError as e:
                self._gone(sock, f"its socket failed: {e}")
                return
            if sent == len(frame) and not data:
                return
            # Whole or not at all: half a frame would garble every later one.
            with trio.CancelScope(shield=True):
                with trio.move_on_after(SEND_TIMEOUT_S) as timer:
                    try:
                        await _send_all(sock, frame[sent:])
                        if data:
                            await _send_all(sock, data)
                    except OSError as e:
                        self._gone(sock, f"its socket failed: {e}")
                        return
                if timer.cancelled_caught:
                    self._gone(sock, f"it took nothing for {SEND_TIMEOUT_S:g} s")

    # ------------------------------------------------------------ replies

    async def _read_loop(self, sock: socket.socket) -> None:
        buf = bytearray()
        why = "its socket closed"
        # The last read took all the socket had (less than it asked for): the next one
        # waits for more first, rather than asking a socket known to be empty.
        drained = False
        try:
            while True:
                while len(buf) < HEADER.size:
                    if not (n := await self._recv(sock, buf, drained)):
                        return
                    drained = n < _RECV
                head, size = HEADER.unpack_from(buf)
                if head > MAX_HEADER or size > MAX_READ:
                    why = f"it sent a frame of {head} + {size} bytes, over the limit"
                    return
                while len(buf) < HEADER.size + head:
                    if not (n := await self._recv(sock, buf, drained)):
                        return
                    drained = n < _RECV
                try:
                    reply = _decode_reply(bytes(buf[HEADER.size:HEADER.size + head]))
                except msgspec.DecodeError as e:
                    why = f"it sent a header that is not ours ({e})"
                    return
                del buf[:HEADER.size + head]
                data = b""
                if size:
                    data = bytearray(size)
                    got = min(len(buf), size)
                    data[:got] = buf[:got]
                    del buf[:got]
                    view = memoryview(data)
                    while got < size:
                        n = await _recv_into(sock, view[got:])
                        if not n:
                            return
                        got += n
                        drained = False
                    view.release()
                self._deliver(reply, data)
        except (OSError, trio.ClosedResourceError) as e:
            why = f"its socket failed: {e}"
        finally:
            self._gone(sock, why)

    async def _recv(self, sock: socket.socket, buf: bytearray, wait_first: bool) -> int:
        """Read what the socket has onto `buf`, waiting for it to have something (first, if
        `wait_first`): how many bytes, 0 at its end."""
        if wait_first:
            await trio.lowlevel.wait_readable(sock)
        while True:
            try:
                data, anc, _flags, _ = sock.recvmsg(_RECV, socket.CMSG_SPACE(4),
                                                    socket.MSG_CMSG_CLOEXEC)
                break
            except BlockingIOError:
                await trio.lowlevel.wait_readable(sock)
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
                for fd in fds:
                    # In order: each goes to the frame that says it brought one (the
                    # descriptor comes with the frame's first byte, before its header is whole).
                    if len(self._fds) < MAX_FDS_QUEUED and sock is self._sock:
                        self._fds.append(fd)
                    else:
                        os.close(fd)
        buf += data
        return len(data)

    def _deliver(self, reply: _HelperReply, data: bytes) -> None:
        fd = None
        if reply.ok is not None and (reply.ok.get("fd") is True or reply.id == 0):
            fd = self._fds.popleft() if self._fds else None
            if reply.id == 0 and self._pidfd is None:
                self._pidfd, fd = fd, None  # the helper's own, with its hello
        waiter = self._waiters.get(reply.id)
        if fd is not None and (waiter is None or reply.ok.get("fd") is not True):
            os.close(fd)
            fd = None
        if waiter is None:
            return  # its caller gave up
        if reply.events is not None and waiter.on_events is not None:
            try:
                waiter.on_events(reply.events, reply.dropped, reply.started)
            except Exception:
                log.exception("a watch's events could not be handled")
        if reply.ok is None and reply.error is None:
            return  # events only
        waiter.reply = reply
        waiter.data = data
        waiter.fd = fd
        waiter.done.set()

    def _gone(self, sock: socket.socket, why: str) -> None:
        """The helper on `sock` is done for: kill it, fail what waits on it."""
        if sock is not self._sock:
            return
        self._why_gone = why
        self._sock = None
        if self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except OSError:
                pass
            os.close(self._pidfd)
            self._pidfd = None
        trio.lowlevel.notify_closing(sock)
        sock.close()
        while self._fds:
            os.close(self._fds.popleft())
        for waiter in self._waiters.values():
            waiter.done.set()


async def _read_fd(fd: int, result: dict, offset: int, length: int) -> tuple[dict, bytes]:
    """A part of a file the helper opened for us (its descriptor: closed here), read in a
    worker thread in one go."""
    def work() -> tuple[dict, bytes]:
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise SandboxError(Fault.IO, "the session's file helper passed something that "
                                   "is not a regular file")
            want = max(0, min(length, st.st_size - offset))
            data = bytearray(want)
            view = memoryview(data)
            got = 0
            while got < want:
                n = os.preadv(fd, [view[got:]], offset + got)
                if n == 0:
                    break  # it shrank meanwhile
                got += n
            view.release()
            del data[got:]
            size = os.fstat(fd).st_size
        except OSError as e:
            raise SandboxError(Fault.IO, f"reading the file failed: {e.strerror}") from None
        finally:
            os.close(fd)
        return {**result, "size": size, "eof": offset + got >= size}, data

    return await trio.to_thread.run_sync(work)


async def _send_all(sock: socket.socket, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view):]
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)


async def _recv_into(sock: socket.socket, view: memoryview) -> int:
    while True:
        try:
            return sock.recv_into(view)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)
