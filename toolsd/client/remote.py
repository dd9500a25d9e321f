"""Where a client connects, and how it trusts a TLS daemon (PROTOCOL.md 1.2): the Target,
the client's TLS context, the fingerprint check. No I/O.

A URL is `unix:///path/to.sock`, `tls://host:port`, or a bare socket path; when none is
given, `$TOOLSD_URL`, else the default socket. A TLS target authenticates with a token
(`token=`, else `$TOOLSD_TOKEN`) and trusts the daemon by its certificate's fingerprint
(`fingerprint=`, else `$TOOLSD_FINGERPRINT`: the self-signed case, no name checked), or by a
CA (`cafile=`: names checked as for HTTPS), else by the system's CAs. The certificate is
checked before the token is sent: a wrong fingerprint never sees the token.
"""

from __future__ import annotations

import dataclasses
import hmac
import os
import ssl

from toolsd.client.core import ConnectionLost
from toolsd.wire.paths import resolve_socket_path
from toolsd.wire.urls import TLS, UNIX, Address, fingerprint_of, normalize_fingerprint, parse_url

__all__ = ["Target", "resolve_target", "target_from_options", "tls_context",
           "check_certificate", "CertificateMismatch"]

CLIENT_NAME = "toolsd-client"


class CertificateMismatch(ConnectionLost):
    """The daemon's certificate is not the one pinned: the connection was closed before the
    token was sent."""


@dataclasses.dataclass(frozen=True)
class Target:
    address: Address
    token: str | None = None
    fingerprint: str | None = None  # normalized
    cafile: str | None = None

    @property
    def tls(self) -> bool:
        return self.address.kind == TLS

    @property
    def url(self) -> str:
        return str(self.address)

    @property
    def where(self) -> str:
        """How messages name it: the socket path, or the URL."""
        return self.address.path if self.address.kind == UNIX else self.url


def resolve_target(url: str | Target | None = None, *, token: str | None = None,
                   fingerprint: str | None = None, cafile: str | None = None,
                   environ: dict[str, str] | None = None) -> Target:
    """The target of a client's arguments and the environment; ValueError when malformed."""
    if isinstance(url, Target):
        return url
    env = os.environ if environ is None else environ
    text = url or env.get("TOOLSD_URL") or ""
    if not text:
        return Target(Address(UNIX, path=resolve_socket_path(None)))
    address = parse_url(text)
    if address.kind == UNIX:
        return Target(Address(UNIX, path=resolve_socket_path(address.path)))
    if token is None:
        token = env.get("TOOLSD_TOKEN") or None
    if fingerprint is None and cafile is None:
        fingerprint = env.get("TOOLSD_FINGERPRINT") or None
    return Target(address, token=token,
                  fingerprint=normalize_fingerprint(fingerprint) if fingerprint else None,
                  cafile=cafile)


def target_from_options(url: str | None = None, socket: str | None = None,
                        token_file: str | None = None, fingerprint: str | None = None,
                        cafile: str | None = None) -> Target:
    """The target of a command line's options (`--url`, else `--socket`, else the
    environment): the token read from `token_file`, a bare token or the last word of a
    `TENANT TOKEN` line. ValueError says what is wrong."""
    if url is None and socket is not None:
        url = resolve_socket_path(socket)
    token = None
    if token_file is not None:
        try:
            with open(os.path.expanduser(token_file), encoding="utf-8") as f:
                words = f.read().split()
        except OSError as e:
            raise ValueError(f"--token-file {token_file}: {e.strerror}") from None
        if not words:
            raise ValueError(f"--token-file {token_file} is empty")
        token = words[-1]
    return resolve_target(url, token=token, fingerprint=fingerprint, cafile=cafile)


def tls_context(target: Target) -> ssl.SSLContext:
    """TLS 1.3 only. Pinned: no CA and no name checked here, the fingerprint is, by
    check_certificate, right after the handshake."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    if target.fingerprint is not None:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif target.cafile is not None:
        context.load_verify_locations(cafile=target.cafile)
    else:
        context.load_default_certs()
    return context


def check_certificate(target: Target, der: bytes | None) -> None:
    """Raise CertificateMismatch unless the daemon's certificate is the pinned one."""
    if target.fingerprint is None:
        return
    got = fingerprint_of(der or b"")
    if not hmac.compare_digest(got, target.fingerprint):
        raise CertificateMismatch(
            f"the daemon at {target.url} shows a certificate with fingerprint {got}, not the "
            f"expected {target.fingerprint}; the token was not sent. If the daemon made a new "
            f"certificate, take its fingerprint from `toolsd token` there; otherwise something "
            f"between you and it is not the daemon")


def hello_params(target: Target) -> dict:
    """The first request on a TLS connection: it authenticates."""
    return {"client": CLIENT_NAME, "token": target.token or ""}


def refused(target: Target, error: Exception) -> ConnectionLost:
    """ConnectionLost for a TLS connect that failed (refused, TLS handshake failed)."""
    what = getattr(error, "strerror", None) or getattr(error, "reason", None) or str(error)
    hint = ("; is it running with --listen?" if isinstance(error, ConnectionRefusedError)
            else "; is it a toolsd TLS port (TLS 1.3)? check the URL" if isinstance(
                error, ssl.SSLError) else "")
    return ConnectionLost(f"cannot reach toolsd at {target.url} ({what}){hint}")
