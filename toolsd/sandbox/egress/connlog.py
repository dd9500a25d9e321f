"""A session's connection log (session.network) and its refusals (network_denied). Pure:
the proxy writes it, calls read it; bounded however many connections a session makes."""

from __future__ import annotations

import collections
import dataclasses
import time

MAX_ENTRIES = 1000
# network_denied on one result lists at most this many, then says how many more.
MAX_DENIED_LISTED = 20


@dataclasses.dataclass
class LoggedConnection:
    at: float
    host: str
    port: int
    verdict: str  # "allowed" | "denied"
    why: str
    sent: int = 0  # bytes from the session, counted while the connection lasts
    received: int = 0

    def line(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}: {self.why}"


class ConnectionLog:
    """Entries numbered from 0 in the order they were made; the oldest are dropped past
    MAX_ENTRIES. Refusals are counted apart, so a result can list those of its call."""

    def __init__(self, max_entries: int = MAX_ENTRIES):
        self._entries: collections.deque[LoggedConnection] = collections.deque(
            maxlen=max_entries)
        self._next = 0  # number of the next entry
        # (when, "host:port: why") of each refusal, for the results of the calls it fell in.
        self._denied: collections.deque[tuple[float, str]] = collections.deque(maxlen=max_entries)

    def add(self, host: str, port: int, verdict: str, why: str, *,
            now: float | None = None) -> LoggedConnection:
        entry = LoggedConnection(time.time() if now is None else now, host, port, verdict, why)
        self._entries.append(entry)
        self._next += 1
        if verdict == "denied":
            self._denied.append((entry.at, entry.line()))
        return entry

    def allowed(self, host: str, port: int, why: str = "allowed") -> LoggedConnection:
        return self.add(host, port, "allowed", why)

    def denied(self, host: str, port: int, why: str) -> LoggedConnection:
        return self.add(host, port, "denied", why)

    def refuse(self, entry: LoggedConnection, why: str) -> None:
        """An allowed connection refused after all (its TLS server name, say)."""
        entry.verdict, entry.why = "denied", why
        self._denied.append((time.time(), entry.line()))

    def read(self, since: int = 0) -> tuple[list[LoggedConnection], int, int]:
        """(entries numbered `since` on, the number to read from next, how many entries
        from `since` on were dropped before this read)."""
        first = self._next - len(self._entries)
        start = max(since, first)
        entries = list(self._entries)[start - first:] if start < self._next else []
        dropped = max(0, min(first, self._next) - since)
        return entries, self._next, dropped

    def denied_since(self, since: float) -> list[str]:
        """Refusals made at `since` (time.time()) or later as `host:port: why`, each distinct
        one once, at most MAX_DENIED_LISTED and a line saying how many more."""
        lines: dict[str, None] = {}
        for at, line in reversed(self._denied):
            if at < since:
                break
            lines.setdefault(line, None)
        listed = list(reversed(lines))
        if len(listed) > MAX_DENIED_LISTED:
            more = len(listed) - MAX_DENIED_LISTED
            listed = listed[:MAX_DENIED_LISTED] + [
                f"... and {more} more (session.network lists them)"]
        return listed
