"""The server name of a TLS ClientHello (RFC 8446 4.1.2, RFC 6066 3), read and never changed:
TLS is not intercepted. Pure: `client_hello` takes what the client sent so far."""

from __future__ import annotations

import dataclasses

MAX_HELLO = 64 * 1024
_HANDSHAKE, _CLIENT_HELLO = 0x16, 0x01
_SERVER_NAME, _ECH = 0x0000, 0xFE0D


class NotTLS(ValueError):
    """The bytes are no TLS ClientHello, or one the proxy cannot check."""


@dataclasses.dataclass(frozen=True)
class Hello:
    server_name: str | None  # lowercased; None when the client named none


def looks_like_tls(data: bytes) -> bool:
    """Whether the first bytes are a TLS handshake record (False for fewer than 3)."""
    return len(data) >= 3 and data[0] == _HANDSHAKE and data[1] == 3


def client_hello(data: bytes) -> Hello | None:
    """The ClientHello in `data` (one or more records), or None while it is not whole.
    NotTLS if it is none, or carries an encrypted one (ECH) whose name cannot be seen."""
    body = bytearray()
    pos = 0
    while True:
        if len(data) < pos + 5:
            return None
        if data[pos] != _HANDSHAKE or data[pos + 1] != 3:
            raise NotTLS("not a TLS handshake")
        length = int.from_bytes(data[pos + 3:pos + 5], "big")
        if length == 0 or length > 16384 + 256:
            raise NotTLS("a TLS record of impossible length")
        if len(data) < pos + 5 + length:
            if pos + 5 + length > MAX_HELLO:
                raise NotTLS("a ClientHello longer than the proxy reads")
            return None
        body += data[pos + 5:pos + 5 + length]
        pos += 5 + length
        if len(body) >= 4:
            if body[0] != _CLIENT_HELLO:
                raise NotTLS("the first handshake message is no ClientHello")
            need = 4 + int.from_bytes(body[1:4], "big")
            if need > MAX_HELLO:
                raise NotTLS("a ClientHello longer than the proxy reads")
            if len(body) >= need:
                return _parse(bytes(body[4:need]))


def _parse(hello: bytes) -> Hello:
    reader = _Reader(hello)
    reader.take(2 + 32)  # legacy version, random
    reader.take(reader.number(1))  # session id
    reader.take(reader.number(2))  # cipher suites
    reader.take(reader.number(1))  # compression methods
    if reader.left() == 0:
        return Hello(None)  # no extensions at all
    extensions = _Reader(reader.take(reader.number(2)))
    name = None
    seen = set()
    while extensions.left():
        kind = extensions.number(2)
        data = extensions.take(extensions.number(2))
        if kind in seen:
            raise NotTLS("a ClientHello with a repeated extension")
        seen.add(kind)
        if kind == _ECH:
            raise NotTLS("an encrypted ClientHello (ECH), whose server name cannot be checked")
        if kind == _SERVER_NAME:
            name = _server_name(data)
    return Hello(name)


def _server_name(data: bytes) -> str:
    names = _Reader(_Reader(data).take_rest_of(2))
    found = []
    while names.left():
        kind = names.number(1)
        value = names.take(names.number(2))
        if kind == 0:
            found.append(value)
    if len(found) != 1:
        raise NotTLS("a ClientHello naming no server, or more than one")
    try:
        return found[0].decode("ascii").lower()
    except UnicodeDecodeError:
        raise NotTLS("a server name that is not ASCII") from None


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def left(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int) -> bytes:
        if n > self.left():
            raise NotTLS("a truncated ClientHello")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def number(self, size: int) -> int:
        return int.from_bytes(self.take(size), "big")

    def take_rest_of(self, size: int) -> bytes:
        """A length-prefixed vector that must fill the rest."""
        data = self.take(self.number(size))
        if self.left():
            raise NotTLS("a malformed ClientHello extension")
        return data
