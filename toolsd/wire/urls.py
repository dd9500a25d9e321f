"""Where a client reaches the daemon (PROTOCOL.md 1.2, "TCP with TLS and tokens"): a URL,
`unix:///path/to.sock` or `tls://host:port`, or a bare socket path as before. Pure.

Fingerprints are the SHA-256 of the server certificate's DER bytes, written `sha256:` and 64
hex digits; colons and case are accepted when read (as `openssl x509 -fingerprint` prints
them)."""

from __future__ import annotations

import dataclasses
import hashlib
import re

__all__ = ["Address", "parse_url", "fingerprint_of", "normalize_fingerprint"]

UNIX = "unix"
TLS = "tls"


@dataclasses.dataclass(frozen=True)
class Address:
    kind: str  # UNIX or TLS
    path: str = ""  # UNIX
    host: str = ""  # TLS
    port: int = 0  # TLS

    def __str__(self) -> str:
        if self.kind == UNIX:
            return f"unix://{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tls://{host}:{self.port}"


_HOST_PORT = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^\[\]:/]+)):(?P<port>\d+)$")


def parse_url(url: str, *, listening: bool = False) -> Address:
    """The address in `url`; ValueError says what is wrong and what is expected. A
    listener's port may be 0 (the system picks a free one)."""
    if "://" not in url:
        if not url:
            raise ValueError("an empty address: give unix:///path/to.sock or tls://host:port")
        return Address(UNIX, path=url)
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    if scheme == UNIX:
        if not rest.startswith("/"):
            raise ValueError(f"{url!r}: a unix URL names an absolute path, "
                             f"unix:///path/to.sock (three slashes)")
        return Address(UNIX, path=rest)
    if scheme == TLS:
        match = _HOST_PORT.match(rest.rstrip("/"))
        if match is None:
            raise ValueError(f"{url!r}: a tls URL is tls://HOST:PORT (an IPv6 address in "
                             f"brackets: tls://[::1]:7433)")
        port = int(match["port"])
        if not (0 if listening else 1) <= port < 65536:
            raise ValueError(f"{url!r}: port {port} is not between 1 and 65535")
        return Address(TLS, host=match["v6"] or match["host"], port=port)
    raise ValueError(f"{url!r}: unknown scheme {scheme!r}; toolsd speaks unix:// and tls://")


def fingerprint_of(der: bytes) -> str:
    return "sha256:" + hashlib.sha256(der).hexdigest()


def normalize_fingerprint(text: str) -> str:
    """`sha256:` and 64 lowercase hex digits; ValueError if `text` is not a SHA-256 one."""
    value = text.strip().lower()
    for prefix in ("sha256:", "sha256=", "sha256 fingerprint="):
        value = value.removeprefix(prefix)
    value = value.replace(":", "")
    if not re.fullmatch(r"[0-9a-f]{64}", value):
        raise ValueError(f"{text!r} is not a SHA-256 certificate fingerprint (sha256: and 64 hex "
                         f"digits; `toolsd token` on the server prints it)")
    return "sha256:" + value
