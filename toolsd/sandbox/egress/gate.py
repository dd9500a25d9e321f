"""The order of checks of one connection (PROTOCOL.md 1.2): the name (or the address's CIDR)
and the port first, then the name resolved by the host's resolver, then every address it
resolved to; what passes is the very list of addresses the daemon connects to.

A name refused by the rule is never resolved, so no resolver ever sees it.
"""

from __future__ import annotations

import dataclasses
import time

from toolsd.sandbox.egress.addresses import IPAddress, why_refused
from toolsd.sandbox.egress.dial import Upstream, Upstreams
from toolsd.sandbox.egress.resolver import OWN, ResolveError
from toolsd.sandbox.egress.rules import BadRule, Rule, host_name

CACHE_S = 10.0
CACHE_MAX = 256


@dataclasses.dataclass(frozen=True)
class Destination:
    label: str  # the host as the log shows it: the normalised name, or the address
    port: int
    addrs: tuple[IPAddress, ...]  # checked; empty when going by name through `upstream`
    name: str | None = None  # the name asked for (None for an address)
    upstream: Upstream | None = None


class Refused(Exception):
    def __init__(self, label: str, port: int, why: str):
        super().__init__(why)
        self.label, self.port, self.why = label, port, why


class Gate:
    def __init__(self, rule: Rule, resolver, upstreams: Upstreams = Upstreams()):
        self.rule = rule
        self.resolver = resolver
        self.upstreams = upstreams
        self._cache: dict[str, tuple[float, tuple[IPAddress, ...]]] = {}

    def name_of(self, text: str, port: int | None) -> str | IPAddress:
        """The host `text` normalised; Refused if it is no host or the rule refuses it."""
        try:
            host = host_name(text)
        except BadRule:
            raise Refused(text[:80], port or 0, f"{text[:80]!r} is not a host name") from None
        if isinstance(host, str):
            why = self.rule.why_name_refused(host, port)
        else:
            why = self.rule.why_address_refused(host)
            if why is None and port is not None:
                why = self.rule.why_port_refused(port)
        if why is not None:
            raise Refused(str(host), port or 0, why)
        return host

    async def target(self, text: str, port: int, *, tunnel: bool) -> Destination:
        """Where a connection to text:port goes; Refused, or ResolveError, if nowhere."""
        host = self.name_of(text, port)
        if not isinstance(host, str):
            self.check_address(str(host), port, host)
            return Destination(str(host), port, (host,))
        upstream = self.upstreams.for_host(host, tunnel=tunnel)
        try:
            addrs = await self.addresses(host, port)
        except ResolveError:
            if upstream is None:
                raise
            # Behind a proxy the host often resolves no outside name: the proxy does.
            return Destination(host, port, (), host, upstream)
        return Destination(host, port, addrs, host, upstream)

    async def addresses(self, name: str, port: int) -> tuple[IPAddress, ...]:
        """The checked addresses of the allowed `name`: Refused if any is refused (a name
        that resolves to one private address among public ones is not used at all)."""
        now = time.monotonic()
        cached = self._cache.get(name)
        if cached is not None and cached[0] > now:
            addrs = cached[1]
        else:
            addrs = tuple(await self.resolver.resolve(name))
            if len(self._cache) >= CACHE_MAX:
                self._cache.clear()
            self._cache[name] = (now + CACHE_S, addrs)
        for addr in addrs:
            self.check_address(name, port, addr)
        if not addrs:
            raise ResolveError(f"{name} has no address")
        return addrs

    def check_address(self, label: str, port: int, addr: IPAddress) -> None:
        rule = self.rule
        if rule.deny.has_address(addr):
            raise Refused(label, port, f"{label} resolves to {addr}, which the deny list names")
        if addr in self.resolver.exempt or rule.allow.has_address(addr):
            return
        why = why_refused(addr, OWN)
        if why is not None:
            said = f"{addr} is {why}" if label == str(addr) else \
                f"{label} resolves to {addr}, {why}"
            raise Refused(label, port, f"{said} (allowed only by an allow CIDR naming it)")
