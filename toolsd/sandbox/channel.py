"""The launcher channel's two sockets, read and written straight, without trio's sockets.

Messages go to the launcher as marshal, whose start cannot afford the json module (see its
imports); they come back as JSON, since what leaves a sandbox is not to be trusted. The
format is described in driver/launcher.py.
"""

from __future__ import annotations

import array
import errno
import marshal
import os
import socket
from collections.abc import Sequence

import msgspec
import trio

from toolsd.sandbox.errors import LauncherError

MAX_MSG = 1 << 18  # more than any datagram the default socket buffers let through
MAX_FDS = 4
ANC_SIZE = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
# Messages read in a row without waiting before the reader lets other tasks run.
RECV_STREAK = 16

_json_decode = msgspec.json.Decoder().decode


def close_all(fds) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class Channel:
    """Resource handling: owns both sockets of the channel (the control one, which the
    launcher and every shim write to us on, and the spawn one, read by the launcher's spare
    shim only); `close()` closes them, which the launcher takes as its cue to end."""

    def __init__(self, ours: socket.socket, spawn_ours: socket.socket):
        # trio's sockets for closing (they tell trio's waiters); the same sockets, now
        # non-blocking, for calls made directly (see recv and send).
        self._sock = trio.socket.from_stdlib_socket(ours)
        self._spawn_sock = trio.socket.from_stdlib_socket(spawn_ours)
        self._raw, self._spawn_raw = ours, spawn_ours
        self._send_lock = trio.Lock()
        self._spawn_lock = trio.Lock()
        self._streak = 0  # messages read in a row without waiting (see recv)

    async def recv(self) -> tuple[dict | None, list[int]]:
        """The next message and the fds that came with it (the caller's to close); None at
        EOF; {"op": "unreadable"} for a message that is not one."""
        # The socket directly, waiting only when nothing is there: trio's recvmsg passes
        # through the scheduler on every call (see fdio), and every spawn waits for two
        # messages. Messages that keep coming without a wait get a yield now and then.
        while True:
            try:
                data, anc, flags, _ = self._raw.recvmsg(MAX_MSG, ANC_SIZE,
                                                        socket.MSG_CMSG_CLOEXEC)
                break
            except BlockingIOError:
                self._streak = 0
                await trio.lowlevel.wait_readable(self._raw)
        self._streak += 1
        if self._streak > RECV_STREAK:
            self._streak = 0
            await trio.lowlevel.cancel_shielded_checkpoint()  # the fds received stay ours
        fds: list[int] = []
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                arr = array.array("i")
                arr.frombytes(payload[: len(payload) - len(payload) % arr.itemsize])
                fds.extend(arr)
        if not data:
            close_all(fds)
            return None, []
        try:
            msg = _json_decode(data)
        except (msgspec.DecodeError, RecursionError):
            msg = None
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or not isinstance(msg, dict):
            close_all(fds)
            return {"op": "unreadable"}, []  # dropped; the launcher never sends such things
        return msg, fds

    async def send(self, msg: dict, fds: Sequence[int] = (), *, spawn: bool = False) -> None:
        """Send `msg` with `fds` (on the spawn socket if `spawn`). LauncherError if it is too
        large to send; OSError or trio.ClosedResourceError if the channel failed."""
        data = marshal.dumps(msg)
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        sock, lock = (self._spawn_raw, self._spawn_lock) if spawn else (self._raw,
                                                                         self._send_lock)
        await trio.lowlevel.checkpoint_if_cancelled()
        # Straight to the socket, as in recv; the lock without a yield when it is free.
        if lock.locked():
            await lock.acquire()
        else:
            lock.acquire_nowait()
        try:
            while True:
                try:
                    sock.sendmsg([data], anc)
                    break
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(sock)
        except OSError as e:
            if e.errno == errno.EMSGSIZE:
                raise LauncherError(f"the command and its environment are too large to "
                                    f"send ({len(data)} bytes); shorten them") from None
            raise
        finally:
            lock.release()

    def close(self) -> None:
        """Close both sockets (the spawn one first); idempotent."""
        self._spawn_sock.close()
        self._sock.close()
