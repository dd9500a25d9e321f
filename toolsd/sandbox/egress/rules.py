"""A session's egress rule: which names, networks and ports it may reach. Pure.

Names are compared lowercased, IDNA-encoded, one trailing dot stripped. `*.suffix` matches
any name under the suffix, not the suffix itself. `deny` wins over `allow`. An IP address is
reached only through a CIDR entry of `allow` (a bare address counts as its own /32 or /128).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re

from toolsd.sandbox.egress.addresses import IPAddress, parse_ip

DEFAULT_PORTS = (80, 443)
MAX_ENTRIES = 1000
_LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?")

NETWORK_OFF = "network is off for this session"


class BadRule(ValueError):
    """An entry of the rule that cannot be used; the message names it."""


def normalize_name(name: str) -> str:
    """`name` as the rule compares it: lowercase, IDNA (punycode), no trailing dot. BadRule
    if it is no host name."""
    if not isinstance(name, str):
        raise BadRule(f"{name!r} is not a host name")
    text = name.strip()
    if text != name or not text:
        raise BadRule(f"{name!r} is not a host name (empty, or spaces around it)")
    text = text.lower()
    if not text.isascii():
        try:
            text = text.encode("idna").decode("ascii")
        except UnicodeError:
            raise BadRule(f"{name!r} is not a valid international host name") from None
    text = text.removesuffix(".")
    for label in text.split("."):
        if not _LABEL.fullmatch(label):
            raise BadRule(f"{name!r} is not a host name (label {label!r})")
    result = text
    if len(result) > 253:
        raise BadRule(f"{name[:40]!r}... is longer than a host name can be (253)")
    return result


@dataclasses.dataclass(frozen=True)
class Names:
    exact: frozenset[str] = frozenset()
    suffixes: tuple[str, ...] = ()  # ".suffix", for `*.suffix`
    nets: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()

    def has_name(self, name: str) -> bool:
        return name in self.exact or any(name.endswith(s) for s in self.suffixes)

    def has_address(self, addr: IPAddress) -> bool:
        return any(addr.version == n.version and addr in n for n in self.nets)


def parse_names(entries: object, what: str) -> Names:
    if not isinstance(entries, (list, tuple)):
        raise BadRule(f"network.{what} must be a list of names, got {type(entries).__name__}")
    if len(entries) > MAX_ENTRIES:
        raise BadRule(f"network.{what} has {len(entries)} entries, over {MAX_ENTRIES}")
    exact, suffixes, nets = set(), [], []
    for entry in entries:
        if not isinstance(entry, str):
            raise BadRule(f"network.{what} entry {entry!r} is not a string")
        try:
            if "/" in entry or parse_ip(entry) is not None:
                nets.append(_network(entry))
            elif entry.startswith("*."):
                suffixes.append("." + normalize_name(entry[2:]))
            else:
                exact.add(normalize_name(entry))
        except BadRule as e:
            raise BadRule(f"network.{what} entry {entry!r}: {e}; give a host name "
                          f"(docs.example.org), *.suffix, or a CIDR (192.0.2.0/24)") from None
    return Names(frozenset(exact), tuple(sorted(set(suffixes))), tuple(nets))


def _network(entry: str):
    addr = parse_ip(entry.split("/", 1)[0])
    if addr is None:
        raise BadRule("not an address")
    bits = entry.split("/", 1)[1] if "/" in entry else str(addr.max_prefixlen)
    try:
        return ipaddress.ip_network(f"{addr}/{bits}", strict=False)
    except ValueError as e:
        raise BadRule(str(e)) from None


@dataclasses.dataclass(frozen=True)
class Rule:
    """What a filtered session may reach. `off`: nothing at all (network "none")."""

    allow: Names = Names()
    deny: Names = Names()
    ports: frozenset[int] = frozenset(DEFAULT_PORTS)
    off: bool = False

    def why_name_refused(self, name: str, port: int | None) -> str | None:
        """Why `name` (normalised) at `port` is refused before it is resolved, or None.
        Port None: a DNS query, which names no port."""
        if self.off:
            return NETWORK_OFF
        if self.deny.has_name(name):
            return f"{name} is denied by the session's deny list"
        if not self.allow.has_name(name):
            return f"{name} is not in the session's allow list"
        return None if port is None else self.why_port_refused(port)

    def why_port_refused(self, port: int) -> str | None:
        if port not in self.ports:
            return (f"port {port} is not in the session's ports "
                    f"({', '.join(map(str, sorted(self.ports)))})")
        return None

    def why_address_refused(self, addr: IPAddress) -> str | None:
        """Why the IP literal `addr` is refused before any check of what it is, or None."""
        if self.off:
            return NETWORK_OFF
        if self.deny.has_address(addr):
            return f"{addr} is denied by the session's deny list"
        if not self.allow.has_address(addr):
            return f"{addr} is an IP address, allowed only by a CIDR entry of allow"
        return None


OFF = Rule(off=True)


def parse_rule(allow: object, deny: object = (), ports: object = DEFAULT_PORTS) -> Rule:
    """The Rule of a session.open `network` map; BadRule naming the bad entry."""
    if not isinstance(ports, (list, tuple)) or not ports:
        raise BadRule("network.ports must be a non-empty list of port numbers")
    for port in ports:
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            raise BadRule(f"network.ports entry {port!r} is not a port number (1-65535)")
    return Rule(parse_names(allow, "allow"), parse_names(deny, "deny"), frozenset(ports))


def host_name(host: str) -> str | IPAddress:
    """A host a client asked for: an address (any literal form), else the normalised name.
    BadRule if it is neither."""
    addr = parse_ip(host)
    if addr is not None:
        return addr
    return normalize_name(host)
