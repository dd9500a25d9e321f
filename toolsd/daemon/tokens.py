"""The tokens a TCP client authenticates with, each naming a tenant (PROTOCOL.md 1.2).

`--tokens FILE`: one `TENANT TOKEN` or `TENANT sha256:HEX` per line (`#` comments and blank
lines allowed); the file must not be readable by anyone but its owner. Without it, one token
for tenant `default` is made at first start in the state folder (`token`, 0600) and kept.

The file is read at start and again whenever it changes (TokenFile), so tokens can be added
and revoked without a restart (a revoked token lets no new connection in; connections it
let in stay). A file that stops being valid keeps the last good tokens, and the log says why.

Only SHA-256 digests are held: a presented token is hashed and compared with every entry in
constant time (hmac.compare_digest, never stopping at the first match), so neither the reply
nor its timing says how much of a guess was right.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import stat

from toolsd.daemon.tenants import LOCAL

__all__ = ["TokenTable", "TokenFile", "TokenFileError", "load_file", "default_token",
           "DEFAULT_TENANT"]

log = logging.getLogger("toolsd.server")

DEFAULT_TENANT = "default"
TOKEN_FILE = "token"  # in the state folder
TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
MIN_TOKEN_CHARS = 16


class TokenFileError(Exception):
    """A tokens file toolsd will not use; the message says what to fix."""


class TokenTable:
    def __init__(self, entries: list[tuple[str, bytes]]):
        self._entries = entries  # (tenant, sha256 digest of the token)

    @property
    def tenants(self) -> list[str]:
        return sorted({tenant for tenant, _ in self._entries})

    def match(self, token: str) -> str | None:
        """The tenant `token` names, or None."""
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        found = None
        for tenant, expected in self._entries:
            if hmac.compare_digest(digest, expected):
                found = tenant
        return found


def _parse(text: str, where: str) -> list[tuple[str, bytes]]:
    entries, seen = [], {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise TokenFileError(f"{where}:{n}: a line is `TENANT TOKEN` or "
                                 f"`TENANT sha256:HEX`, two fields")
        tenant, token = parts
        if not TENANT_NAME.fullmatch(tenant):
            raise TokenFileError(f"{where}:{n}: tenant {tenant!r}: use letters, digits and "
                                 f". _ @ - (at most 64)")
        if tenant == LOCAL:
            raise TokenFileError(f"{where}:{n}: the tenant name {LOCAL!r} is the Unix socket's "
                                 f"(it sees everything); pick another name")
        if token.lower().startswith("sha256:"):
            hex_digest = token[7:].lower()
            if not re.fullmatch(r"[0-9a-f]{64}", hex_digest):
                raise TokenFileError(f"{where}:{n}: sha256: must be followed by 64 hex digits "
                                     f"(`printf %s TOKEN | sha256sum`)")
            digest = bytes.fromhex(hex_digest)
        else:
            if len(token) < MIN_TOKEN_CHARS:
                raise TokenFileError(f"{where}:{n}: the token of {tenant} is shorter than "
                                     f"{MIN_TOKEN_CHARS} characters; make a long random one "
                                     f"(python3 -c 'import secrets; print(secrets.token_urlsafe())')")
            digest = hashlib.sha256(token.encode()).digest()
        if digest in seen:
            raise TokenFileError(f"{where}:{n}: the same token as line {seen[digest]}; "
                                 f"each token names one tenant")
        seen[digest] = n
        entries.append((tenant, digest))
    if not entries:  # allowed: nobody may connect until a line is added (read again then)
        log.warning("%s holds no tokens: no TCP client can authenticate until a line "
                    "`TENANT TOKEN` is added", where)
    return entries


def _check_private(path: str, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise TokenFileError(f"{path} is not a regular file")
    if st.st_uid not in (os.getuid(), 0):
        raise TokenFileError(f"{path} belongs to uid {st.st_uid}, not to this user")
    if st.st_mode & 0o077:
        raise TokenFileError(f"{path} can be read or written by others (mode "
                             f"{stat.S_IMODE(st.st_mode):o}); `chmod 600 {path}` and start "
                             f"again")


def load_file(path: str) -> TokenTable:
    """The tokens of `--tokens FILE`; TokenFileError says what is wrong with it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as e:
        raise TokenFileError(f"cannot open the tokens file {path}: {e.strerror}") from None
    with os.fdopen(fd, encoding="utf-8", errors="strict") as f:
        _check_private(path, os.fstat(fd))
        try:
            text = f.read()
        except UnicodeDecodeError:
            raise TokenFileError(f"{path} is not UTF-8 text") from None
    return TokenTable(_parse(text, path))


def default_token(state_dir: str) -> tuple[TokenTable, str]:
    """The state folder's token for tenant `default`, made at first start; (table, token)."""
    path = os.path.join(state_dir, TOKEN_FILE)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        table = load_file(path)
        with open(path, encoding="utf-8") as f:
            token = f.read().split()[1]
        return table, token
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as f:
        f.write(f"{DEFAULT_TENANT} {token}\n")
    return TokenTable([(DEFAULT_TENANT, hashlib.sha256(token.encode()).digest())]), token


class TokenFile:
    """The tokens of a file, read again when it changes (its inode, size or mtime)."""

    def __init__(self, path: str):
        self.path = path
        self._seen = self._identity()
        self.table = load_file(path)

    def _identity(self) -> tuple | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def current(self) -> TokenTable:
        seen = self._identity()
        if seen != self._seen:
            self._seen = seen
            try:
                self.table = load_file(self.path)
                log.info("tokens read again from %s: tenants %s", self.path,
                         ", ".join(self.table.tenants))
            except TokenFileError as e:
                log.warning("kept the tokens read before: %s", e)
        return self.table
