"""How the daemon resolves a session's allowed names, and tells its own addresses.

`HostResolver` asks the host's resolver (getaddrinfo, in a worker thread, a few at a time per
session). `TestResolver` (toolsd serve --test-resolver FILE, for tests only, never a default)
answers from a map and asks nobody, and exempts exactly the addresses its file lists from
the address check, so that tests reach their own servers on loopback.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket

import trio

from toolsd.sandbox.egress.addresses import IPAddress

RESOLVE_TIMEOUT_S = 10.0
LOOKUPS_PER_SESSION = 4


class ResolveError(Exception):
    """The name has no address (or the resolver failed): the message says which."""


class OwnAddresses:
    """`addr in OWN`: whether `addr` is one of this host's, asked of the kernel now (a socket
    can be bound to an address only if the host has it), so a new interface counts at once."""

    def __contains__(self, addr: object) -> bool:
        if not isinstance(addr, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
            return False
        family = socket.AF_INET if addr.version == 4 else socket.AF_INET6
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            try:
                sock.bind((str(addr), 0))
            except OSError:
                return False
        return True


OWN = OwnAddresses()


class HostResolver:
    exempt: frozenset[IPAddress] = frozenset()

    def __init__(self):
        self._limiter = trio.CapacityLimiter(LOOKUPS_PER_SESSION)

    def for_session(self) -> HostResolver:
        return HostResolver()

    async def resolve(self, name: str, family: int = 0) -> list[IPAddress]:
        """The addresses of `name` (family 0: both), first the resolver's preferred one."""
        with trio.move_on_after(RESOLVE_TIMEOUT_S) as scope:
            async with self._limiter:  # a session's lookups never take every worker thread
                try:
                    infos = await trio.socket.getaddrinfo(name, None, family,
                                                          socket.SOCK_STREAM)
                except socket.gaierror as e:
                    raise ResolveError(f"{name} did not resolve ({e.strerror})") from None
        if scope.cancelled_caught:
            raise ResolveError(f"{name} did not resolve within {RESOLVE_TIMEOUT_S:.0f} s")
        seen: dict[IPAddress, None] = {}
        for _family, _type, _proto, _name, sockaddr in infos:
            seen.setdefault(ipaddress.ip_address(sockaddr[0].split("%", 1)[0]), None)
        return list(seen)


class TestResolver:
    """From a JSON file {"names": {name: [address, ...]}, "exempt": [address, ...],
    "log": path, "head_timeout_s": seconds}: each query's name is appended to `log`, one a
    line, so that a test can tell that a refused name was never asked about;
    `head_timeout_s` shortens the proxies' wait for a client's first bytes."""

    def __init__(self, path: str):
        with open(path) as f:
            spec = json.load(f)
        self.names = {name.lower(): [ipaddress.ip_address(a) for a in addrs]
                      for name, addrs in spec.get("names", {}).items()}
        self.exempt = frozenset(ipaddress.ip_address(a) for a in spec.get("exempt", ()))
        self.log = spec.get("log")
        self.head_timeout_s = spec.get("head_timeout_s")

    def for_session(self) -> TestResolver:
        return self

    async def resolve(self, name: str, family: int = 0) -> list[IPAddress]:
        if self.log:
            fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, name.encode() + b"\n")
            finally:
                os.close(fd)
        await trio.lowlevel.checkpoint()
        addrs = [a for a in self.names.get(name, ())
                 if family == 0 or (a.version == 4) == (family == socket.AF_INET)]
        if name not in self.names:
            raise ResolveError(f"{name} did not resolve (the test resolver has no such name)")
        return addrs
