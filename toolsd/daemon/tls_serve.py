"""`--listen tls://HOST:PORT`: the same frames over TLS 1.3, for clients on other machines
(PROTOCOL.md 1.2, "TCP with TLS and tokens").

A TCP peer is a stranger until its first frame, a `hello` with a token, names a tenant. Until
then it may cost the daemon little: the first frame may be at most AUTH_FRAME_LIMIT bytes
(its length is checked before its body is read, and the body is read in pieces no larger
than what is still missing), the handshake and that frame must be done within AUTH_WAIT_S,
and at most MAX_PENDING connections may be at that stage at once (more are closed at
accept). A silent connection holds a socket and a task (a few KiB); the TLS state, tens of
KiB in OpenSSL, is made only once the peer sends its first bytes, and lives at most
AUTH_WAIT_S unless a token names a tenant. A wrong or missing token is answered `unauthorized` and the connection closed;
failures count against the source address (ratelimit.py), and an address out of tries is
refused without its token being looked at.

Once authenticated, the connection is served by the very Connection a Unix peer gets, with
its tenant: the decrypted bytes are relayed through a socketpair, whose far end the
Connection reads and writes with its own descriptor I/O. Closing either side closes the
other; a connection never owns a session, so a dropped TCP link loses nothing but its
in-flight requests (as on the Unix socket).

Resource handling: `serve_tls` owns its listeners and every connection they accepted (its
handler nursery); each connection task owns its SSLStream and socketpair and closes them.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import socket
from typing import TYPE_CHECKING

import msgspec
import trio

from toolsd.daemon import dispatch
from toolsd.daemon.certs import Certificate
from toolsd.daemon.connection import Connection
from toolsd.daemon.ratelimit import FailureLimiter
from toolsd.daemon.tokens import TokenFile
from toolsd.wire.framing import HEADER_SIZE, encode_frame
from toolsd.wire.protocol import (
    BAD_FRAME,
    FRAME_TOO_LARGE,
    UNAUTHORIZED,
    ErrorBody,
    HelloParams,
    Reply,
    ToolsdError,
    encode_reply,
    request_decoder,
)

if TYPE_CHECKING:
    import ssl

    from toolsd.daemon.supervisor import Supervisor

log = logging.getLogger("toolsd.server")

AUTH_WAIT_S = 10.0
AUTH_FRAME_LIMIT = 4096
MAX_PENDING = 2048
RELAY_SIZE = 64 * 1024
LISTEN_BACKLOG = 4096
_hello_decoder = msgspec.msgpack.Decoder(HelloParams)


@dataclasses.dataclass
class Remote:
    """What every TLS listener of a daemon shares."""

    context: ssl.SSLContext
    certificate: Certificate
    tokens: TokenFile  # read again when it changes
    limiter: FailureLimiter = dataclasses.field(default_factory=FailureLimiter)
    auth_wait_s: float = AUTH_WAIT_S
    pending: int = 0  # connections not yet authenticated


def address_key(host: str) -> str:
    """Whom failures are counted against: the IPv4 address, or the IPv6 /64 (one machine
    commonly holds a whole /64)."""
    try:
        ip = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


async def serve_tls(supervisor: Supervisor, remote: Remote, host: str, port: int,
                    max_frame: int, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Listen on host:port until cancelled; `task_status.started` gets the bound (host,
    port) pairs (port 0 asks the system for a free one)."""
    listeners = await trio.open_tcp_listeners(port, host=host, backlog=LISTEN_BACKLOG)
    bound = [listener.socket.getsockname()[:2] for listener in listeners]

    async def handle(stream: trio.SocketStream) -> None:
        try:
            await _serve_one(supervisor, remote, stream, max_frame)
        except Exception:
            # Whatever one client did, the daemon and everyone else's sessions stay up.
            log.exception("a TLS connection failed; closing it")
        finally:
            await trio.aclose_forcefully(stream)

    async with trio.open_nursery() as nursery:
        task_status.started(bound)
        await trio.serve_listeners(handle, listeners, handler_nursery=nursery)


async def _serve_one(supervisor: Supervisor, remote: Remote, tcp: trio.SocketStream,
                     max_frame: int) -> None:
    try:
        peer = tcp.socket.getpeername()[0]
    except OSError:
        return
    if remote.pending >= MAX_PENDING:
        log.warning("closed a TLS connection from %s at once: %d others are still "
                    "authenticating", peer, remote.pending)
        return
    remote.pending += 1
    tls = None
    tenant = None
    try:
        with trio.move_on_after(remote.auth_wait_s):
            # TLS state (OpenSSL's buffers: tens of KiB) only once the peer has said
            # something: a silent connection holds a socket and a task.
            await trio.lowlevel.wait_readable(tcp.socket)
            tls = trio.SSLStream(tcp, remote.context, server_side=True)
            tenant = await _authenticate(supervisor, remote, tls, address_key(peer), peer)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        tenant = None  # the handshake failed (not TLS, TLS 1.2, a bad close) or it went
    finally:
        remote.pending -= 1
    if tenant is None:
        if tls is not None:
            await trio.aclose_forcefully(tls)
        return
    log.info("tenant %s connected from %s", tenant, peer)
    await _relay(supervisor, tls, tenant, max_frame)


async def _send(tls: trio.SSLStream, request_id: int, result=None, code: str = "",
                message: str = "") -> None:
    reply = Reply(id=request_id, result=result,
                  error=ErrorBody(code, message) if code else None)
    await tls.send_all(encode_frame(encode_reply(reply)))


async def _read_first_frame(tls: trio.SSLStream) -> bytes | None:
    """The first frame's body; None (the peer told why) if it is too large or cut off."""
    buf = bytearray()
    need = HEADER_SIZE
    while len(buf) < need:
        data = await tls.receive_some(need - len(buf))
        if not data:
            return None
        buf += data
        if need == HEADER_SIZE and len(buf) == HEADER_SIZE:
            length = int.from_bytes(buf, "big")
            if length > AUTH_FRAME_LIMIT:
                await _send(tls, 0, code=FRAME_TOO_LARGE, message=(
                    f"frame of {length} bytes is over the limit of {AUTH_FRAME_LIMIT} bytes "
                    f"before authentication; the first frame is a hello with a token"))
                return None
            need += length
    return bytes(buf[HEADER_SIZE:])


async def _authenticate(supervisor: Supervisor, remote: Remote, tls: trio.SSLStream,
                        key: str, peer: str) -> str | None:
    """The tenant the first frame's token names, with the hello answered; None (the peer
    answered `unauthorized` where it can be) if it names none."""
    await tls.do_handshake()
    body = await _read_first_frame(tls)
    if body is None:
        return None
    try:
        request = request_decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, ValueError) as e:
        await _send(tls, 0, code=BAD_FRAME, message=f"a frame must be a msgpack map with an "
                    f"integer id, a string method and a params map ({e})")
        return None
    now = trio.current_time()
    wait = remote.limiter.wait_s(key, now)
    if wait > 0:
        log.warning("refused a TLS connection from %s: too many failed tokens", peer)
        await _send(tls, request.id, code=UNAUTHORIZED, message=(
            f"too many failed attempts from {peer}; try again in {wait:.0f} s with the right "
            f"token"))
        return None
    token = ""
    if request.method == "hello":
        try:
            token = _hello_decoder.decode(request.params).token
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass
    tenant = remote.tokens.current().match(token) if token else None
    if tenant is None:
        remote.limiter.failed(key, now)
        if request.method != "hello":
            why = f"the first frame on a TCP connection must be hello with a token, not " \
                  f"{request.method[:64]!r}"
        elif not token:
            why = "hello carried no token; give the client the daemon's token (toolsd token)"
        else:
            why = "wrong token; `toolsd token` on the daemon's machine prints the right one"
        log.warning("refused a TLS connection from %s: %s", peer, why.split(";")[0])
        await _send(tls, request.id, code=UNAUTHORIZED, message=why)
        return None
    hello = dispatch.METHODS["hello"]
    try:
        result = await hello.call(supervisor, hello.decode(request), None, tenant)
    except ToolsdError as e:  # bad params of an otherwise good hello: authenticated all the same
        await _send(tls, request.id, code=e.code, message=e.message)
        return tenant
    await _send(tls, request.id, result=result)
    return tenant


async def _relay(supervisor: Supervisor, tls: trio.SSLStream, tenant: str,
                 max_frame: int) -> None:
    """Serve the authenticated connection: a Connection on one end of a socketpair, the TLS
    stream relayed to the other, until either side ends."""
    near, far = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    inner = trio.SocketStream(trio.socket.from_stdlib_socket(far))
    outer = trio.SocketStream(trio.socket.from_stdlib_socket(near))
    try:
        async with trio.open_nursery() as nursery:
            async def serve_connection() -> None:
                try:
                    await Connection(inner, supervisor, max_frame, tenant).serve()
                except Exception:
                    log.exception("a connection failed; closing it")
                finally:
                    await trio.aclose_forcefully(inner)

            async def from_client() -> None:
                try:
                    while data := await tls.receive_some(RELAY_SIZE):
                        await outer.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                # The client is gone: the Connection reads EOF and cancels its requests.
                try:
                    await outer.send_eof()
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass

            async def to_client() -> None:
                try:
                    while data := await outer.receive_some(RELAY_SIZE):
                        await tls.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                nursery.cancel_scope.cancel()  # the Connection is over: so is the link

            nursery.start_soon(serve_connection)
            nursery.start_soon(from_client)
            nursery.start_soon(to_client)
    finally:
        await trio.aclose_forcefully(outer)
        await trio.aclose_forcefully(inner)
        await trio.aclose_forcefully(tls)
