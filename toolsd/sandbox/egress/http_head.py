"""The head of a request to the HTTP proxy: CONNECT host:port, or an absolute-form request
(`GET http://host/path HTTP/1.1`) rewritten for the origin. Pure."""

from __future__ import annotations

import dataclasses
import re

MAX_HEAD = 64 * 1024
MAX_HEADERS = 200
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# Hop-by-hop headers (RFC 9110 7.6.1) and the proxy's own: never passed to the origin.
_HOP = {b"connection", b"keep-alive", b"proxy-connection", b"proxy-authorization",
        b"proxy-authenticate", b"te", b"trailer", b"upgrade"}


class BadHead(ValueError):
    """A request the proxy cannot serve: `status` is the HTTP status to answer with."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class Head:
    method: bytes
    host: str  # as the client wrote it (brackets of an IPv6 address removed)
    port: int
    path: bytes  # origin-form target; b"" for CONNECT
    version: bytes
    headers: tuple[tuple[bytes, bytes], ...]

    @property
    def connect(self) -> bool:
        return self.method == b"CONNECT"

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    def for_origin(self, upstream_auth: bytes | None = None) -> bytes:
        """The request head as the origin gets it: origin-form target, no hop-by-hop or proxy
        headers, `Connection: close` (one request per connection to the proxy), a Host
        header when the client sent none. With `upstream_auth` (b"" for none), the head for
        an upstream proxy instead: absolute-form, with that Proxy-Authorization line."""
        dropped = set(_HOP)
        for value in (self.header(b"connection") or b"").split(b","):
            dropped.add(value.strip().lower())
        target = self.path
        if upstream_auth is not None:
            target = b"http://" + authority(self.host, self.port, 80).encode() + self.path
        lines = [b"%s %s %s" % (self.method, target, self.version)]
        if upstream_auth:
            lines.append(upstream_auth.rstrip(b"\r\n"))
        if self.header(b"host") is None:
            lines.append(b"Host: " + authority(self.host, self.port, 80).encode())
        lines += [k + b": " + v for k, v in self.headers if k.lower() not in dropped]
        lines.append(b"Connection: close")
        return b"\r\n".join(lines) + b"\r\n\r\n"


def host_header(data: bytes) -> bytes | None:
    """The Host header of the request head `data`, of any form (None without one)."""
    for line in data.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"host":
            return value.strip(b" \t")
    return None


def looks_like_http(data: bytes) -> bool:
    """Whether `data` starts like an HTTP request line (`GET /...`)."""
    return re.match(rb"[A-Z]{3,10} \S", data) is not None


def head_end(buffer: bytes) -> int:
    """The length of the head in `buffer` (its blank line included), or -1 if not whole."""
    end = buffer.find(b"\r\n\r\n")
    return end + 4 if end >= 0 else -1


def parse_head(data: bytes) -> Head:
    """The head `data` (up to and with its blank line); BadHead if the proxy cannot serve it."""
    lines = data[:-4].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not parts[2].startswith(b"HTTP/1."):
        raise BadHead(400, "not an HTTP/1.x request line")
    method, target, version = parts
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.fullmatch(name):
            raise BadHead(400, "a malformed header line")
        headers.append((name, value.strip(b" \t")))
    if len(headers) > MAX_HEADERS:
        raise BadHead(431, f"more than {MAX_HEADERS} headers")
    text = target.decode("latin-1")
    if method == b"CONNECT":
        host, port = split_authority(text, None)
        return Head(method, host, port, b"", version, tuple(headers))
    match = re.fullmatch(r"([A-Za-z][A-Za-z0-9+.-]*)://([^/?#]*)([^#]*)", text)
    if match is None:
        raise BadHead(400, "this is a proxy: send absolute-form requests "
                      "(GET http://host/path) or CONNECT host:port")
    if match[1].lower() != "http":
        raise BadHead(400, f"{match[1]}:// through the proxy needs CONNECT (TLS is never "
                      f"intercepted)")
    if "@" in match[2]:
        raise BadHead(400, "credentials in the URL's host part are not passed on")
    host, port = split_authority(match[2], 80)
    path = match[3].encode("latin-1") or b"/"
    return Head(method, host, port, path, version, tuple(headers))


def split_authority(text: str, default_port: int | None) -> tuple[str, int]:
    """`host:port`, `[v6]:port` or (with a default) a bare host; BadHead otherwise."""
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else None
        if not sep or (rest and port_text is None):
            raise BadHead(400, f"{text!r} is not host:port")
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            host, port_text = text, None
    if port_text is None or port_text == "":
        if default_port is None:
            raise BadHead(400, f"{text!r} has no port: CONNECT takes host:port")
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise BadHead(400, f"{text!r} has no valid port")
    if not host:
        raise BadHead(400, f"{text!r} has no host")
    return host, int(port_text)


def authority(host: str, port: int, default_port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port == default_port else f"{shown}:{port}"


def response(status: int, reason: str) -> bytes:
    """A short reply from the proxy itself, its reason as the one-line body."""
    phrase = {400: "Bad Request", 403: "Forbidden", 405: "Method Not Allowed",
              408: "Request Timeout", 431: "Request Header Fields Too Large",
              502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}
    body = (f"toolsd: {reason}\n").encode("utf-8", "replace")
    return (f"HTTP/1.1 {status} {phrase.get(status, 'Error')}\r\nContent-Type: text/plain; "
            f"charset=utf-8\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
            f"X-Toolsd-Egress: refused\r\n\r\n").encode() + body


ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"
