"""Connections out of the daemon for a session: to the very addresses checked, or through the
upstream proxy that the daemon's own environment names (many users sit behind one)."""

from __future__ import annotations

import base64
import dataclasses
import socket
import urllib.parse
from collections.abc import Mapping

import trio

from toolsd.sandbox.egress.addresses import IPAddress
from toolsd.sandbox.egress.http_head import MAX_HEAD, head_end

CONNECT_TIMEOUT_S = 30.0


class DialError(Exception):
    """No connection could be made; the message says to what and why."""


@dataclasses.dataclass(frozen=True)
class Upstream:
    """An HTTP proxy of the daemon's environment."""

    host: str
    port: int
    authorization: bytes = b""  # a Proxy-Authorization header line, from user:pass@ in the URL


@dataclasses.dataclass(frozen=True)
class Upstreams:
    http: Upstream | None = None  # for plain HTTP (http_proxy)
    tunnel: Upstream | None = None  # for CONNECT and SOCKS (https_proxy, else all_proxy)
    no_proxy: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Upstreams:
        """The daemon's proxy settings; only http:// proxies are used (ValueError otherwise,
        said at the daemon's start)."""
        def get(name: str) -> str:
            return env.get(name.lower()) or env.get(name.upper()) or ""

        no_proxy = tuple(p.strip().lower().lstrip("*").lstrip(".")
                         for p in get("no_proxy").split(",") if p.strip())
        tunnel = get("https_proxy") or get("all_proxy")
        return cls(_parse(get("http_proxy")), _parse(tunnel), no_proxy)

    def for_host(self, name: str, *, tunnel: bool) -> Upstream | None:
        if any(p == "" or name == p or name.endswith("." + p) for p in self.no_proxy):
            return None
        return self.tunnel if tunnel else self.http


def _parse(url: str) -> Upstream | None:
    if not url:
        return None
    if "://" not in url:
        url = "http://" + url
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"upstream proxy {url!r}: toolsd passes allowed connections only "
                         f"through an http:// proxy; set https_proxy to one")
    auth = b""
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        secret = urllib.parse.unquote(parts.password or "")
        token = base64.b64encode(f"{user}:{secret}".encode()).decode()
        auth = f"Proxy-Authorization: Basic {token}\r\n".encode()
    return Upstream(parts.hostname, parts.port or 3128, auth)


async def open_address(addrs: list[IPAddress], port: int) -> trio.SocketStream:
    """A TCP connection to the first of `addrs` that answers: exactly those addresses, no
    name is resolved here."""
    errors = []
    for addr in addrs:
        family = socket.AF_INET if addr.version == 4 else socket.AF_INET6
        sock = trio.socket.socket(family, socket.SOCK_STREAM)
        try:
            with trio.fail_after(CONNECT_TIMEOUT_S):
                await sock.connect((str(addr), port))
        except (OSError, trio.TooSlowError) as e:
            sock.close()
            errors.append(f"{addr}: {getattr(e, 'strerror', None) or 'timed out'}")
            continue
        except BaseException:
            sock.close()
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return trio.SocketStream(sock)
    raise DialError("could not connect (" + "; ".join(errors) + ")")


async def open_upstream(upstream: Upstream) -> trio.SocketStream:
    try:
        with trio.fail_after(CONNECT_TIMEOUT_S):
            return await trio.open_tcp_stream(upstream.host, upstream.port)
    except (OSError, trio.TooSlowError) as e:
        raise DialError(f"the upstream proxy {upstream.host}:{upstream.port} did not answer "
                        f"({getattr(e, 'strerror', None) or 'timed out'})") from None


async def open_tunnel(upstream: Upstream, host: str, port: int) -> trio.SocketStream:
    """A CONNECT tunnel to host:port through `upstream` (which resolves `host` itself)."""
    stream = await open_upstream(upstream)
    try:
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        await stream.send_all(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n".encode()
                              + upstream.authorization + b"\r\n")
        head = b""
        with trio.move_on_after(CONNECT_TIMEOUT_S):
            while head_end(head) < 0 and len(head) <= MAX_HEAD:
                data = await stream.receive_some(4096)
                if not data:
                    break
                head += data
        if head_end(head) < 0:
            raise DialError(f"the upstream proxy gave no answer to CONNECT {target}")
        status_line = head.split(b"\r\n", 1)[0]
        status = status_line.split(b" ")
        if len(status) < 2 or status[1] != b"200":
            raise DialError(f"the upstream proxy refused {target}: "
                            f"{status_line.decode('latin-1')}")
        if head_end(head) != len(head):
            raise DialError("the upstream proxy sent data before the tunnel opened")
        return stream
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
