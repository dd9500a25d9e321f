"""A session's egress proxy: the HTTP proxy (CONNECT and absolute-form), the SOCKS5 proxy and
the DNS server of its network namespace, served by the daemon on sockets that the session's
launcher made inside that namespace (so nothing of it runs where the session's code could
kill it), each connection decided by the Gate and recorded in the ConnectionLog.

Resource handling: `serve()` runs in the session's nursery; it owns the listening sockets
and every connection it accepted and closes them when cancelled. A session holds at most
`ProxyLimits.connections` connections at once, and all sessions together `Budget.limit`: past
either, a new one is refused at once, so no session can take the daemon's descriptors.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import socket

import trio

from toolsd.sandbox.egress import dns_message as dns
from toolsd.sandbox.egress import dns_stub, http_head, sni, socks
from toolsd.sandbox.egress.connlog import ConnectionLog, LoggedConnection
from toolsd.sandbox.egress.dial import DialError, open_address, open_tunnel, open_upstream
from toolsd.sandbox.egress.gate import Destination, Gate, Refused
from toolsd.sandbox.egress.splice_relay import relay
from toolsd.sandbox.egress.resolver import ResolveError
from toolsd.sandbox.egress.rules import host_name
from toolsd.sandbox.egress.proxy_env import DNS_PORT, HOST, HTTP_PORT, SOCKS_PORT

log = logging.getLogger("toolsd.egress")

# Ports whose tunnels must open with a TLS ClientHello.
TLS_PORTS = frozenset({443})


@dataclasses.dataclass(frozen=True)
class ProxyLimits:
    connections: int = 256  # open at once per session, each holding two daemon fds
    head_timeout_s: float = 30.0  # for the request line, the SOCKS handshake, the ClientHello


class Budget:
    """Proxied connections open at once in all the daemon's sessions, and how many may be:
    each holds two of the daemon's descriptors (owned by the daemon's EgressHost)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0


class _Closed(Exception):
    """The client went away, or sent too little in time: end quietly."""


class EgressProxy:
    def __init__(self, gate: Gate, log_: ConnectionLog, limits: ProxyLimits = ProxyLimits(),
                 budget: Budget | None = None):
        self.gate = gate
        self.log = log_
        self.limits = limits
        self.budget = budget or Budget(limits.connections)
        self.active = 0
        self.refused_busy = 0  # connections refused at the limit (logged once a second)
        self._busy_logged = -1.0
        self.failed: str | None = None

    async def serve(self, listeners: dict[str, socket.socket], *,
                    task_status=trio.TASK_STATUS_IGNORED) -> None:
        socks_ = {name: trio.socket.from_stdlib_socket(s) for name, s in listeners.items()}
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._accept, socks_["http"], self._http, HTTP_PORT)
                nursery.start_soon(self._accept, socks_["socks"], self._socks, SOCKS_PORT)
                nursery.start_soon(self._accept, socks_["dns_tcp"], self._dns_tcp, DNS_PORT)
                nursery.start_soon(dns_stub.serve_udp, socks_["dns_udp"], self.answer_dns)
                task_status.started()
        except Exception as e:
            # Never the daemon's end: the session's network is off from now on (its
            # listeners closed, so a connection is refused at once), and its log says so.
            log.exception("egress proxy failed")
            self.failed = f"the session's egress proxy failed ({e!r}); its network is off"
            self.log.denied(HOST, HTTP_PORT, self.failed)
        finally:
            for s in socks_.values():
                s.close()

    # ------------------------------------------------------------ connections

    async def _accept(self, listener, handler, port: int) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                try:
                    conn, _ = await listener.accept()
                except OSError as e:
                    if e.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                        raise
                    log.warning("egress proxy: cannot accept (%s); retrying", e.strerror)
                    await trio.sleep(0.1)
                    continue
                if self.active >= self.limits.connections:
                    self._refuse_busy(conn, port, f"the session has {self.limits.connections} "
                                      f"connections open, its limit; close some first")
                    continue
                if self.budget.used >= self.budget.limit:
                    self._refuse_busy(conn, port, f"the daemon has {self.budget.limit} proxied "
                                      f"connections open, its limit for all sessions")
                    continue
                self.active += 1
                self.budget.used += 1
                nursery.start_soon(self._one, handler, trio.SocketStream(conn))

    def _refuse_busy(self, conn, port: int, why: str) -> None:
        reply = {HTTP_PORT: http_head.response(503, why),
                 SOCKS_PORT: socks.choice(socks.NO_METHOD)}.get(port, b"")
        try:
            os.write(conn.fileno(), reply)  # non-blocking: what does not fit is dropped
        except OSError:
            pass
        conn.close()
        self.refused_busy += 1
        now = trio.current_time()
        if now - self._busy_logged >= 1.0:
            self._busy_logged = now
            self.log.denied(HOST, port, why)

    async def _one(self, handler, stream: trio.SocketStream) -> None:
        try:
            await handler(stream)
        except (_Closed, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        except Exception:
            # One connection's fault (ours or its peer's) never ends the session's proxy.
            log.exception("egress proxy: a connection failed")
        finally:
            self.active -= 1
            self.budget.used -= 1
            await trio.aclose_forcefully(stream)

    async def _read(self, stream, buffer: bytes, enough) -> bytes:
        """`buffer` and what more the client sends until `enough(buffer)` holds."""
        with trio.move_on_after(self.limits.head_timeout_s):
            while not enough(buffer):
                data = await stream.receive_some(16384)
                if not data:
                    raise _Closed
                buffer += data
            return buffer
        raise _Closed

    # ------------------------------------------------------------ HTTP

    async def _http(self, client) -> None:
        def whole(b: bytes) -> bool:
            return http_head.head_end(b) >= 0 or len(b) > http_head.MAX_HEAD

        try:
            data = await self._read(client, b"", whole)
        except _Closed:
            return
        end = http_head.head_end(data)
        try:
            if end < 0:
                raise http_head.BadHead(431, "the request head is over 64 KiB")
            head = http_head.parse_head(data[:end])
        except http_head.BadHead as e:
            await client.send_all(http_head.response(e.status, e.reason))
            return
        rest = data[end:]
        try:
            target = await self.gate.target(head.host, head.port, tunnel=head.connect)
            if not head.connect:
                self._check_host_header(head, target)
        except Refused as e:
            self.log.denied(e.label, e.port, e.why)
            await client.send_all(http_head.response(403, f"{e.label}:{e.port}: {e.why}"))
            return
        except ResolveError as e:
            self.log.denied(host_name_or(head.host), head.port, str(e))
            await client.send_all(http_head.response(502, str(e)))
            return
        try:
            server = await self._dial(target, tunnel=head.connect)
        except DialError as e:
            self.log.allowed(target.label, target.port, str(e))
            await client.send_all(http_head.response(502, f"{target.label}: {e}"))
            return
        async with server:
            entry = self.log.allowed(target.label, target.port)
            if head.connect:
                await client.send_all(http_head.ESTABLISHED)
                await relay(client, server, entry, rest, self._tunnel_check(client, target, entry))
            else:
                auth = target.upstream.authorization if target.upstream else None
                await relay(client, server, entry, head.for_origin(auth) + rest)

    def _check_host_header(self, head: http_head.Head, target: Destination) -> None:
        why = self._host_header_refused(head.header(b"host"), target)
        if why is not None:
            raise Refused(target.label, target.port, why)

    @staticmethod
    def _host_header_refused(value: bytes | None, target: Destination) -> str | None:
        if value is None:
            return None
        try:
            host, port = http_head.split_authority(value.decode("latin-1"), 80)
            if str(host_name(host)) == target.label and port in (target.port, 80):
                return None
        except (http_head.BadHead, ValueError):
            pass
        return (f"the Host header {value.decode('latin-1')[:80]!r} does not match the "
                f"request's host {target.label}")

    async def _dial(self, target: Destination, *, tunnel: bool) -> trio.SocketStream:
        if target.upstream is None:
            return await open_address(list(target.addrs), target.port)
        if tunnel:
            return await open_tunnel(target.upstream, target.name or target.label, target.port)
        return await open_upstream(target.upstream)

    def _tunnel_check(self, client, target: Destination, entry: LoggedConnection):
        """What a tunnel's first bytes must be: a ClientHello naming the very host asked
        for (on a TLS port, or wherever one comes), or a plain HTTP request whose Host
        header names it."""
        async def check(data: bytes) -> bytes | None:
            # Whatever comes short of being checked (a pause before the rest of a
            # ClientHello included) ends the tunnel: nothing unchecked gets through.
            try:
                data = await self._read(client, data, lambda b: len(b) >= 3)
            except _Closed:
                return None
            why = None
            if sni.looks_like_tls(data):
                hello = None
                while hello is None:
                    try:
                        hello = sni.client_hello(data)
                    except sni.NotTLS as e:
                        why = str(e)
                        break
                    if hello is None:
                        data = await self._read(client, data,
                                                lambda b, n=len(data): len(b) > n)
                if why is None:
                    why = self._server_name_refused(hello.server_name, target)
            elif target.port in TLS_PORTS:
                why = f"port {target.port} takes TLS only, and this is no ClientHello"
            elif http_head.looks_like_http(data):
                data = await self._read(client, data, lambda b: http_head.head_end(b) >= 0
                                        or len(b) > http_head.MAX_HEAD)
                why = self._host_header_refused(http_head.host_header(data), target)
            if why is not None:
                self.log.refuse(entry, why)
                return None
            return data

        return check

    def _server_name_refused(self, name: str | None, target: Destination) -> str | None:
        if target.name is not None:
            if name is None:
                return f"the ClientHello names no server; {target.label} was asked for"
            if str(host_name_or(name)) != target.label:
                return (f"the TLS server name {name[:80]!r} does not match the host asked "
                        f"for, {target.label}")
            return None
        if name is not None:  # an address allowed by a CIDR: the name must be allowed too
            try:
                self.gate.name_of(name, target.port)
            except Refused as e:
                return f"the TLS server name {name[:80]!r}: {e.why}"
        return None

    # ------------------------------------------------------------ SOCKS5

    async def _socks(self, client) -> None:
        try:
            data = await self._read(client, b"", lambda b: socks.parse_greeting(b) is not None)
            used, no_auth = socks.parse_greeting(data)
            await client.send_all(socks.choice(socks.NO_AUTH if no_auth else socks.NO_METHOD))
            if not no_auth:
                return
            data = await self._read(client, data[used:],
                                    lambda b: socks.parse_request(b) is not None)
            used, request = socks.parse_request(data)
        except socks.BadSocks as e:
            if e.code is not None:
                await client.send_all(socks.reply(e.code))
            return
        try:
            target = await self.gate.target(request.host, request.port, tunnel=True)
        except Refused as e:
            self.log.denied(e.label, e.port, e.why)
            await client.send_all(socks.reply(socks.NOT_ALLOWED))
            return
        except ResolveError as e:
            self.log.denied(host_name_or(request.host), request.port, str(e))
            await client.send_all(socks.reply(socks.HOST_UNREACHABLE))
            return
        try:
            server = await self._dial(target, tunnel=True)
        except DialError as e:
            self.log.allowed(target.label, target.port, str(e))
            await client.send_all(socks.reply(socks.CONNECTION_REFUSED))
            return
        async with server:
            entry = self.log.allowed(target.label, target.port)
            await client.send_all(socks.reply(socks.SUCCEEDED))
            await relay(client, server, entry, data[used:], self._tunnel_check(client, target, entry))

    # ------------------------------------------------------------ DNS

    async def _dns_tcp(self, stream) -> None:
        await dns_stub.serve_tcp(stream, self.answer_dns)

    async def answer_dns(self, query: dns.Query) -> bytes:
        """The stub's answer: REFUSED for a name the rule refuses (never resolved), else the
        checked addresses of the type asked for."""
        if query.qclass != dns.CLASS_IN:
            return dns.answer(query, dns.REFUSED)
        try:
            name = self.gate.name_of(query.name, None)
            if not isinstance(name, str):
                raise Refused(query.name, DNS_PORT, "an address is not a name to look up")
            if query.qtype not in (dns.A, dns.AAAA):
                return dns.answer(query, dns.NOERROR)
            addrs = await self.gate.addresses(name, DNS_PORT)
        except Refused as e:
            self.log.denied(e.label, DNS_PORT, f"{e.why} (DNS query refused)")
            return dns.answer(query, dns.REFUSED)
        except ResolveError:
            return dns.answer(query, dns.NXDOMAIN)
        return dns.answer(query, dns.NOERROR, list(addrs)[:16])


def host_name_or(text: str) -> str:
    try:
        return str(host_name(text))
    except ValueError:
        return text[:80]
