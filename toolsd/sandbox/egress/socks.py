"""SOCKS5 (RFC 1928) as the proxy speaks it: no authentication, CONNECT only, names passed to
the proxy (socks5h) or addresses. Pure: each parser takes what was read so far and returns
None while it needs more."""

from __future__ import annotations

import dataclasses
import ipaddress

VERSION = 5
NO_AUTH, NO_METHOD = 0x00, 0xFF
CONNECT = 0x01
# Reply codes.
SUCCEEDED = 0x00
GENERAL_FAILURE = 0x01
NOT_ALLOWED = 0x02  # "connection not allowed by ruleset"
HOST_UNREACHABLE = 0x04
CONNECTION_REFUSED = 0x05
TTL_EXPIRED = 0x06
COMMAND_NOT_SUPPORTED = 0x07
ADDRESS_NOT_SUPPORTED = 0x08


class BadSocks(ValueError):
    """A request the proxy refuses; `code` is the reply code (None: close without one)."""

    def __init__(self, code: int | None, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason


def parse_greeting(data: bytes) -> tuple[int, bool] | None:
    """(bytes used, whether "no authentication" is offered), or None for more."""
    if len(data) < 2:
        return None
    if data[0] != VERSION:
        raise BadSocks(None, f"not SOCKS5 (version byte {data[0]})")
    end = 2 + data[1]
    if len(data) < end:
        return None
    return end, NO_AUTH in data[2:end]


@dataclasses.dataclass(frozen=True)
class SocksRequest:
    host: str  # a name as sent, or an address's text
    port: int
    is_name: bool


def parse_request(data: bytes) -> tuple[int, SocksRequest] | None:
    """(bytes used, the CONNECT request), or None for more; BadSocks for any other."""
    if len(data) < 5:
        return None
    if data[0] != VERSION:
        raise BadSocks(None, "not SOCKS5")
    if data[1] != CONNECT:
        raise BadSocks(COMMAND_NOT_SUPPORTED, "only CONNECT is supported (no BIND, no UDP)")
    kind = data[3]
    if kind == 1:
        end = 4 + 4
    elif kind == 4:
        end = 4 + 16
    elif kind == 3:
        end = 5 + data[4]
    else:
        raise BadSocks(ADDRESS_NOT_SUPPORTED, f"address type {kind} is unknown")
    if len(data) < end + 2:
        return None
    raw = data[4:end]
    port = int.from_bytes(data[end:end + 2], "big")
    if kind == 3:
        try:
            host = raw[1:].decode("ascii")
        except UnicodeDecodeError:
            host = raw[1:].decode("utf-8", "replace")  # refused by the name check
        return end + 2, SocksRequest(host, port, True)
    return end + 2, SocksRequest(str(ipaddress.ip_address(raw)), port, False)


def choice(method: int) -> bytes:
    return bytes([VERSION, method])


def reply(code: int) -> bytes:
    """A reply with the bound address 0.0.0.0:0 (clients do not use it)."""
    return bytes([VERSION, code, 0, 1, 0, 0, 0, 0, 0, 0])
