"""The launcher channel: its messages, and its two sockets, read and written straight, without
trio's sockets.

Messages go to the launcher as marshal, whose start cannot afford the json module (see its
imports): dicts, since marshal takes no Struct, built here only (`spawn_message`,
`ping_message`). They come back as JSON, since what leaves a sandbox is not to be trusted,
decoded into the tagged Structs below. The format is described in driver/launcher.py.
"""

from __future__ import annotations

import array
import errno
import logging
import marshal
import math
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Final

import msgspec
import trio

from toolsd.sandbox.errors import LauncherError

log = logging.getLogger("toolsd.launcher")

MAX_MSG = 1 << 18  # more than any datagram the default socket buffers let through
MAX_FDS = 4
ANC_SIZE = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
# Messages read in a row without waiting before the reader lets other tasks run.
RECV_STREAK = 16



# What the launcher and its shims send us. A field the daemon does without has a default: were
# it required, a message lacking it would be dropped, and its spawn would wait for ever.
class _Msg(msgspec.Struct, tag_field="op", frozen=True):
    pass


class Ready(_Msg, tag="ready"):
    """The launcher runs (fds: its pidfd); the programs it found on its PATH."""
    pid: int = -1  # in the sandbox's pid namespace
    bash: str | None = None
    sh: str | None = None
    python3: str | None = None
    node: str | None = None


class Listening(_Msg, tag="listening"):
    """Before `ready`, when asked: the egress proxy's listeners in the sandbox's network
    namespace (fds: one per name, e.g. "tcp:3128"), or why they could not be made."""
    names: list[str] = []
    error: str = ""


class Pong(_Msg, tag="pong"):
    n: int | None = None


class Started(_Msg, tag="started"):
    """The command runs (fds: pidfd of its shim, the hold pipe, then the pidfd of the command
    if the spawn said "ack", and a "tty" spawn's master side)."""
    job: int
    pid: int = 0  # in the sandbox's pid namespace


class Failed(_Msg, tag="error"):
    """The command could not be started. `unstarted`: its shim died before starting it, so
    it never ran and may be sent again."""
    job: int
    message: str = ""
    limit: bool = False  # a resource limit refused it
    unstarted: bool = False


class Exited(_Msg, tag="exited"):
    """The command exited; `done` when nothing of its tree is left either."""
    job: int
    code: int | None = None
    signal: int | None = None
    done: bool = False


class Done(_Msg, tag="done"):
    """Nothing of the command's tree is left."""
    job: int


class Connected(_Msg, tag="connected"):
    """A connect request's answer (port.forward; fds: the socket, connected or under way),
    or its `error` with `errno` when the connect failed at once."""
    n: int
    error: str = ""
    errno: int = 0


FromLauncher = Ready | Listening | Pong | Started | Failed | Exited | Done | Connected
# A datagram that is no message of ours (truncated, not JSON, an unknown op, a field of the
# wrong type): dropped, as the launcher never sends one.
UNREADABLE: Final = object()

_decode = msgspec.json.Decoder(FromLauncher).decode


def decode(data: bytes) -> FromLauncher | object:
    """The message in `data`, or UNREADABLE."""
    try:
        return _decode(data)
    except (msgspec.DecodeError, RecursionError):
        return UNREADABLE


def spawn_message(job: int, argv: list[str], cwd: str, env: Mapping[str, str],
                  rlimits: Mapping[str, tuple[int, int]] | None, ack: bool,
                  tty: tuple[int, int] | None = None, resume: bool = False) -> dict:
    """A spawn request (fds: the command's stdin, stdout, stderr, then its extra fds). Rlimit
    pairs go as lists: the launcher compares them with the lists it applied last. With `tty`
    (cols, rows) the command's fds 0-2 are a new terminal instead; `started` then brings its
    master side as a fourth fd. With `resume` the shim resumes the command whenever it
    stops."""
    return {"op": "spawn", "job": job, "argv": argv, "cwd": cwd, "env": dict(env),
            "rlimits": {name: list(pair) for name, pair in (rlimits or {}).items()},
            "ack": ack, **({"tty": list(tty)} if tty else {}),
            **({"resume": True} if resume else {})}


def ping_message(n: int) -> dict:
    return {"op": "ping", "n": n}


def connect_message(n: int, port: int, family: int) -> dict:
    """A connect to `port` on the sandbox's loopback, IPv4 or IPv6 (`family` 4 or 6)."""
    return {"op": "connect", "n": n, "port": port, "family": family}


def close_all(fds) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class Channel:
    """Resource handling: owns both sockets of the channel (the control one, which the
    launcher and every shim write to us on, and the spawn one, read by the launcher's spare
    shim only), and `devnull`; `close()` closes them, which the launcher takes as its cue to
    end."""

    def __init__(self, ours: socket.socket, spawn_ours: socket.socket):
        # trio's sockets for closing (they tell trio's waiters); the same sockets, now
        # non-blocking, for calls made directly (see recv and send).
        self._sock = trio.socket.from_stdlib_socket(ours)
        self._spawn_sock = trio.socket.from_stdlib_socket(spawn_ours)
        self._raw, self._spawn_raw = ours, spawn_ours
        self._send_lock = trio.Lock()
        self._spawn_lock = trio.Lock()
        self._streak = 0  # messages read in a row without waiting (see recv)
        # /dev/null, read-only, that spawns send as a command's stdin: one open file passed
        # along by all, instead of an open and a close on each spawn's way. Nothing a
        # command does to its copy changes what another reads from it.
        self.devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)

    async def recv(self) -> tuple[FromLauncher | object | None, list[int]]:
        """The next message and the fds that came with it (the caller's to close); None at
        EOF; UNREADABLE, without fds, for a datagram that is not a message."""
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
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            # The launcher sends nothing over MAX_MSG or MAX_FDS: it was cut on our side, most
            # likely its descriptors past our open-files limit. Unsaid, what waited for it (a
            # spawn's `started`) would fail later with no word of why.
            log.warning("a message from the sandbox launcher was dropped: it came truncated "
                        "(%s); is the daemon at its limit of open files (ulimit -n)?",
                        "its descriptors" if flags & socket.MSG_CTRUNC else "its bytes")
            msg = UNREADABLE
        else:
            msg = decode(data)
        if msg is UNREADABLE:
            close_all(fds)
            return UNREADABLE, []
        return msg, fds

    async def send(self, msg: dict, fds: Sequence[int] = (), *, spawn: bool = False,
                   deadline: float = math.inf) -> None:
        """Send `msg` with `fds` (on the spawn socket if `spawn`). LauncherError if it is too
        large to send; OSError or trio.ClosedResourceError if the channel failed;
        trio.TooSlowError if the socket stays full until `deadline` (trio's clock)."""
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
                    with trio.fail_at(deadline):  # a scope only when it must wait
                        await trio.lowlevel.wait_writable(sock)
        except OSError as e:
            if e.errno == errno.EMSGSIZE:
                raise LauncherError(f"the command and its environment are too large to "
                                    f"send ({len(data)} bytes); shorten them") from None
            raise
        finally:
            lock.release()

    def close(self) -> None:
        """Close both sockets (the spawn one first) and devnull; idempotent."""
        self._spawn_sock.close()
        self._sock.close()
        fd, self.devnull = self.devnull, -1
        if fd != -1:
            os.close(fd)


def listeners_of(msg: Listening, fds: list[int]) -> dict[str, socket.socket]:
    """The sockets a `listening` message carries (the egress proxy's, made inside the
    sandbox's network namespace), by their "kind:port" names; LauncherError if it failed."""
    if msg.error or len(fds) != len(msg.names):
        close_all(fds)
        raise LauncherError(f"the sandbox could not listen for its egress proxy: "
                            f"{msg.error or 'sockets missing'}")
    return {name: socket.socket(fileno=fd) for name, fd in zip(msg.names, fds)}
