"""IP literals in every form a resolver accepts, and which addresses a session may not reach.

Pure. The rule (PROTOCOL.md 1.2) names loopback, private, link-local, multicast and the host's
own addresses: not Python's broader `is_private`, which also takes in the documentation and
benchmark ranges that real names may resolve to on some machines.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Container

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# What the rule calls private, with the IPv6 counterpart (unique local, and the deprecated
# site-local), and the addresses that reach this host without being its own: 0.0.0.0/8 and ::
# connect to the local host on Linux.
_BLOCKED = (
    ("0.0.0.0/8", "an unspecified address (it reaches this host)"),
    ("127.0.0.0/8", "a loopback address"),
    ("10.0.0.0/8", "a private address"),
    ("172.16.0.0/12", "a private address"),
    ("192.168.0.0/16", "a private address"),
    ("169.254.0.0/16", "a link-local address"),
    ("224.0.0.0/4", "a multicast address"),
    ("255.255.255.255/32", "a broadcast address"),
    ("::/128", "an unspecified address (it reaches this host)"),
    ("::1/128", "a loopback address"),
    ("fc00::/7", "a private address"),
    ("fec0::/10", "a private address"),
    ("fe80::/10", "a link-local address"),
    ("ff00::/8", "a multicast address"),
)
BLOCKED = tuple((ipaddress.ip_network(net), why) for net, why in _BLOCKED)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")

_PART = re.compile(r"0[xX][0-9a-fA-F]*|0[0-7]*|[1-9][0-9]*")


def parse_ip(host: str) -> IPAddress | None:
    """`host` as an address, if it is one in any form the C library's resolver takes as an
    address rather than a name: dotted quads, `[v6]`, and inet_aton's legacy forms (decimal
    `2130706433`, hex `0x7f000001`, octal `0177.0.0.1`, short `127.1`, `0x7f.1`). None for a
    name. A zone (`fe80::1%eth0`) is kept out: such an address is link-local anyway."""
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    text = text.split("%", 1)[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    if ":" in text:
        return None
    return _inet_aton(text.removesuffix("."))


def _inet_aton(text: str) -> ipaddress.IPv4Address | None:
    parts = text.split(".")
    if not 1 <= len(parts) <= 4 or not all(_PART.fullmatch(p) for p in parts):
        return None
    values = []
    for p in parts:
        if p[:2] in ("0x", "0X"):
            values.append(int(p[2:] or "0", 16))
        elif p.startswith("0"):
            values.append(int(p, 8))
        else:
            values.append(int(p))
    *head, last = values
    if any(v > 255 for v in head) or last >= 1 << (8 * (4 - len(head))):
        return None
    number = 0
    for v in head:
        number = number << 8 | v
    return ipaddress.IPv4Address(number << (8 * (4 - len(head))) | last)


def embedded_v4(addr: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, compatible, 6to4, NAT64), if any: the
    kernel or a gateway would take it there."""
    if isinstance(addr, ipaddress.IPv4Address):
        return None
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr.sixtofour is not None:
        return addr.sixtofour
    if addr in _NAT64:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    if int(addr) >> 32 == 0 and int(addr) > 1:  # ::a.b.c.d, deprecated "compatible"
        return ipaddress.IPv4Address(int(addr))
    return None


def why_refused(addr: IPAddress, own: Container[IPAddress] = ()) -> str | None:
    """Why a session may not connect to `addr` ("a loopback address", ...), or None. `own`:
    the host's own addresses (resolver.is_own asks the kernel)."""
    for candidate in (addr, embedded_v4(addr)):
        if candidate is None:
            continue
        for net, why in BLOCKED:
            if candidate.version == net.version and candidate in net:
                return why
        if candidate in own:
            return "an address of this host"
    return None
