"""What `toolsd serve --listen tls://...` needs before it listens: the certificate, the
tokens, and the file `toolsd token` reads (`remote.json` in the state folder: the URLs and
the fingerprint, never a token).

The state folder's `tls/` and `token` are made at first start and kept: clients pin the
fingerprint and hold the token, so a restart must not change them.
"""

from __future__ import annotations

import json
import os

from toolsd.daemon import certs, tokens
from toolsd.daemon.ratelimit import FailureLimiter
from toolsd.daemon.tls_serve import Remote
from toolsd.daemon.token_reload import ReloadingTokens
from toolsd.wire.urls import Address, parse_url

__all__ = ["SetupError", "parse_listen", "prepare", "write_info", "INFO_FILE"]

INFO_FILE = "remote.json"


class SetupError(Exception):
    """TLS cannot be served as asked; the message says what to do."""


def parse_listen(url: str) -> Address:
    try:
        address = parse_url(url, listening=True) if "://" in url else None
    except ValueError as e:
        raise SetupError(f"--listen {e}") from None
    if address is None or address.kind != "tls":
        raise SetupError(f"--listen {url!r}: give tls://HOST:PORT (the Unix socket is "
                         f"--socket)")
    return address


def prepare(state_dir: str, hosts: list[str], *, cert: str | None, key: str | None,
            tokens_file: str | None, limiter: FailureLimiter | None = None) -> Remote:
    if (cert is None) != (key is None):
        raise SetupError("--tls-cert and --tls-key go together; give both, or neither for "
                         "a self-signed certificate")
    try:
        certificate = (certs.given(cert, key) if cert is not None
                       else certs.self_signed(os.path.join(state_dir, "tls"), hosts))
        context = certs.server_context(certificate)
    except (certs.CertificateError, OSError) as e:
        raise SetupError(str(e)) from None
    try:
        table = (ReloadingTokens(tokens_file) if tokens_file is not None
                 else tokens.default_token(state_dir)[0])
    except tokens.TokenFileError as e:
        raise SetupError(f"--tokens: {e}" if tokens_file else str(e)) from None
    return Remote(context=context, certificate=certificate, tokens=table,
                  limiter=limiter or FailureLimiter())


def write_info(state_dir: str, urls: list[str], fingerprint: str, tokens_file: str | None,
               socket_path: str) -> None:
    info = {"urls": urls, "fingerprint": fingerprint, "socket": socket_path,
            "tokens_file": tokens_file,
            "token_file": None if tokens_file else os.path.join(state_dir, tokens.TOKEN_FILE)}
    path = os.path.join(state_dir, INFO_FILE)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f, indent=2)
    os.replace(tmp, path)
