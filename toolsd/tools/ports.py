"""port.forward / port.close (protocol 1.2 "ports"): a listener on the daemon's machine per
forward; each connection accepted there is carried to a port of the session's own loopback
through a socket that the session's launcher connects inside the sandbox's network namespace
(driver/port_connect.py) and passes back, relayed with back-pressure (stream_relay.py).

Behaviour a caller sees:
- A forward is (session, port): forwarding the same port again with the same bind (and the
  same host_port, or 0) gives the same listener; other values are bad_params.
- The connect inside is to 127.0.0.1:PORT, then to [::1]:PORT if that was refused (a server
  bound to `localhost` may have taken only ::1). A port nothing listens on fails the
  connection at once: the host side is reset, not left open.
- A bind that is not loopback must be one `toolsd serve --forward-bind` named.
- A connection carried counts as activity of the session (--idle-timeout).
- port.close and session close end the listener and every connection it carries before
  they answer.

Resource handling: PortForwards owns every Forward, by session; a Forward owns its listening
socket and the connections it carries, in a task of its session's nursery (so a session that
ends takes them too); `Forward.aclose()` closes all of it and returns once that is done.
"""

from __future__ import annotations

import enum
import errno
import ipaddress
import logging
import os
import socket
import struct
from typing import TYPE_CHECKING

import trio

from toolsd.sandbox.launch.connects import ConnectFailed
from toolsd.sandbox.errors import LauncherError
from toolsd.tools.stream_relay import relay
from toolsd.wire.ports import ForwardInfo, PortCloseResult, PortForwardParams, PortForwardResult
from toolsd.wire.protocol import BAD_PARAMS, LIMIT_EXCEEDED, NOT_FOUND, ToolsdError

if TYPE_CHECKING:
    from toolsd.tools.session_view import SessionView

log = logging.getLogger("toolsd.ports")

MAX_FORWARDS = 32  # per session
MAX_CONNECTIONS = 512  # carried at once by one forward; more wait in the listen queue
BACKLOG = 128
CONNECT_TIMEOUT_S = 30.0  # the connect inside, for a server whose listen queue is full
# After accept fails for want of descriptors: the pause before the next accept (the
# connections being carried free some as they end).
NO_FDS_PAUSE_S = 0.1
NO_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def check_bind(bind: str, allowed: tuple[str, ...]) -> str:
    """`bind` as an address to listen on, or bad_params: loopback, or one of `allowed`."""
    try:
        address = ipaddress.ip_address(bind)
    except ValueError:
        raise ToolsdError(BAD_PARAMS, f"port.forward: bind {bind!r} is not an IP address; "
                          f"give one such as 127.0.0.1 or ::1") from None
    if not address.is_loopback and str(address) not in allowed:
        raise ToolsdError(BAD_PARAMS, f"port.forward: bind {address} is not loopback, and the "
                          f"daemon allows no other address there; start it with `toolsd serve "
                          f"--forward-bind {address}` to allow it, or leave bind out")
    return str(address)


def check_forward_binds(binds) -> tuple[str, ...]:
    """`--forward-bind` values as addresses (ValueError naming a bad one)."""
    out = []
    for bind in binds:
        try:
            out.append(str(ipaddress.ip_address(bind)))
        except ValueError:
            raise ValueError(f"--forward-bind {bind!r} is not an IP address (such as "
                             f"0.0.0.0, 192.0.2.7 or ::)") from None
    return tuple(out)


class ForwardState(enum.Enum):
    LISTENING = "listening"
    CLOSED = "closed"


class Forward:
    def __init__(self, session: SessionView, port: int, sock: trio.socket.SocketType):
        self.session = session
        self.port = port
        self.host, self.host_port = sock.getsockname()[:2]
        self.state = ForwardState.LISTENING
        self._sock = sock
        self._scope = trio.CancelScope()
        self._slots = trio.Semaphore(MAX_CONNECTIONS)
        self._closed = trio.Event()

    def info(self) -> ForwardInfo:
        return ForwardInfo(port=self.port, host=self.host, host_port=self.host_port)

    async def run(self, forget, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Accept and carry until closed; then `forget(self)`."""
        listener = trio.SocketListener(self._sock)
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    task_status.started()
                    while True:
                        await self._slots.acquire()
                        try:
                            stream = await listener.accept()
                        except OSError as e:
                            self._slots.release()
                            log.warning("session %s, forward of port %d: cannot accept (%s)",
                                        self.session.id, self.port, e)
                            if e.errno not in NO_FDS:
                                return  # the forward ends: session.list no longer shows it
                            await trio.sleep(NO_FDS_PAUSE_S)
                            continue
                        nursery.start_soon(self._carry, stream)
        finally:
            self._sock.close()
            self.state = ForwardState.CLOSED
            forget(self)
            self._closed.set()

    async def aclose(self) -> None:
        self._scope.cancel()
        await self._closed.wait()

    async def _carry(self, outside: trio.SocketStream) -> None:
        try:
            with self.session.call():
                try:
                    # Bounded as a whole: the launcher's answer too (one lost to a daemon
                    # out of descriptors would otherwise be waited for until the close).
                    with trio.fail_after(CONNECT_TIMEOUT_S):
                        inside = await self._connect_inside()
                except (ConnectFailed, LauncherError, OSError, trio.TooSlowError):
                    reset(outside)
                    return
                async with inside:
                    await relay(outside, inside)
        except Exception:  # whatever one connection meets must not end the session's tasks
            log.exception("session %s, forward of port %d: a connection failed", self.session.id,
                          self.port)
        finally:
            self._slots.release()
            await outside.aclose()

    async def _connect_inside(self) -> trio.SocketStream:
        """A stream to the port inside: 127.0.0.1, then ::1 if that refused."""
        for family in (4, 6):
            try:
                fd = await self.session.sandbox.launcher.connect(self.port, family)
            except ConnectFailed as e:
                if e.errno == errno.ECONNREFUSED and family == 4:
                    continue
                raise
            sock = trio.socket.from_stdlib_socket(stream_socket(fd))
            try:
                await trio.lowlevel.wait_writable(sock)
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            except BaseException:
                sock.close()
                raise
            if err == 0:
                return trio.SocketStream(sock)
            sock.close()
            if err != errno.ECONNREFUSED or family == 6:
                raise OSError(err, f"connect to port {self.port}: {errno.errorcode.get(err)}")
        raise OSError(errno.ECONNREFUSED, "refused")


def stream_socket(fd: int) -> socket.socket:
    """The launcher's fd as a TCP socket; anything else (what comes out of a sandbox is not
    trusted) is closed and refused."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        os.close(fd)
        raise
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
        sock.close()
        raise OSError(errno.EPROTOTYPE, "the launcher passed something else than a TCP socket")
    return sock


def reset(stream: trio.SocketStream) -> None:
    """Close with a reset (SO_LINGER 0): the client learns at once that nobody is there."""
    try:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    stream.socket.close()


class PortForwards:
    """Every session's forwards: session id -> port -> Forward, written by forward() and by
    a Forward's end (_forget) only."""

    def __init__(self, allowed_binds: tuple[str, ...] = ()):
        self.allowed_binds = allowed_binds
        self._by_session: dict[str, dict[int, Forward]] = {}

    def info(self, session_id: str) -> list[ForwardInfo]:
        return [f.info() for f in self._by_session.get(session_id, {}).values()]

    async def forward(self, session: SessionView, p: PortForwardParams) -> PortForwardResult:
        session.check_open()
        bind = check_bind(p.bind, self.allowed_binds)
        mine = self._by_session.get(session.id, {})
        known = mine.get(p.port)
        if known is not None:
            if known.host == bind and p.host_port in (0, known.host_port):
                return PortForwardResult(host=known.host, port=known.host_port)
            raise ToolsdError(BAD_PARAMS, f"port.forward: port {p.port} of session "
                              f"{session.id} is already forwarded at {known.host} port "
                              f"{known.host_port}; port.close it first to forward it elsewhere")
        if len(mine) >= MAX_FORWARDS:
            raise ToolsdError(LIMIT_EXCEEDED, f"port.forward: session {session.id} already has "
                              f"{MAX_FORWARDS} forwards, the most it may; port.close one first")
        sock = await listen(bind, p.host_port)
        try:
            session.check_open()  # again: it may have closed while we bound
            forward = Forward(session, p.port, sock)
            await session.nursery.start(forward.run, self._forget)
        except BaseException:
            sock.close()
            raise
        self._by_session.setdefault(session.id, {})[p.port] = forward
        return PortForwardResult(host=forward.host, port=forward.host_port)

    async def close(self, session: SessionView, port: int) -> PortCloseResult:
        forward = self._by_session.get(session.id, {}).get(port)
        if forward is None:
            raise ToolsdError(NOT_FOUND, f"port.close: port {port} of session {session.id} is "
                              f"not forwarded; session.list shows its forwards")
        await forward.aclose()
        return PortCloseResult()

    async def close_session(self, session_id: str) -> None:
        """End every forward of a session (its close); shielded by the caller."""
        for forward in list(self._by_session.get(session_id, {}).values()):
            await forward.aclose()

    def _forget(self, forward: Forward) -> None:
        mine = self._by_session.get(forward.session.id, {})
        if mine.get(forward.port) is forward:
            del mine[forward.port]
        if not mine:
            self._by_session.pop(forward.session.id, None)


async def listen(bind: str, host_port: int) -> trio.socket.SocketType:
    """A listening socket on (bind, host_port), or bad_params saying why not."""
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        await sock.bind((bind, host_port))
        sock.listen(BACKLOG)
    except OSError as e:
        sock.close()
        raise ToolsdError(BAD_PARAMS, f"port.forward: cannot listen on {bind} port {host_port} "
                          f"({e.strerror}); choose another host_port, or 0 for any free "
                          f"one") from None
    return sock
