"""`--tokens FILE` read again whenever the file changes, so that tokens can be added and
withdrawn while the daemon runs (toolsd.cluster gives each session lease its own tenant this
way: it rewrites the file, by a rename, and the next `hello` sees it).

The file is looked at (one stat) at every token check; it is read again only when its inode,
size or modification time changed. A file that became unusable (not private any more,
malformed, gone) is refused with a warning and the last good table stays in force: a mistake
in the file never opens the daemon wider, nor locks every client out at once.

Withdrawing a token refuses new connections with it; a connection already authenticated
keeps its tenant until it closes (the cluster also closes the tenant's sessions).
"""

from __future__ import annotations

import logging
import os

from toolsd.daemon.tokens import TokenFileError, TokenTable, load_file

__all__ = ["ReloadingTokens"]

log = logging.getLogger("toolsd.tokens")


class ReloadingTokens:
    """A TokenTable that follows its file; the first load raises TokenFileError."""

    def __init__(self, path: str):
        self.path = path
        self._seen = self._signature()
        self._table: TokenTable = load_file(path)

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def _refresh(self) -> None:
        seen = self._signature()
        if seen == self._seen:
            return
        self._seen = seen
        try:
            self._table = load_file(self.path)
        except TokenFileError as e:
            log.warning("the tokens file changed and cannot be used (%s); the tokens read "
                        "before stay in force", e)

    @property
    def tenants(self) -> list[str]:
        self._refresh()
        return self._table.tenants

    def match(self, token: str) -> str | None:
        self._refresh()
        return self._table.match(token)
