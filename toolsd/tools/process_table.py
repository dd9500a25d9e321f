"""The daemon's one registry of background processes (alive or finished), in start order,
indexed by id and by session: `add` and `forget` write both indexes together.

Finished processes are remembered (status, last output) so that a stale id gets its final
status; past `remembered` of them, the oldest finished ones are forgotten and their ids are
not_found.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Callable

from toolsd.tools import process_names

if TYPE_CHECKING:
    from toolsd.tools.background_process import BackgroundProcess

MAX_REMEMBERED = 1000

_NONE: Mapping[str, BackgroundProcess] = {}


class ProcessTable:
    def __init__(self, new_id: Callable[[], str], logs: str, remembered: int = MAX_REMEMBERED):
        self._new_id = new_id  # an id never used before (the state folder's counter)
        self.logs = logs  # the folder of their log files
        self._remembered = remembered
        self._by_id: dict[str, BackgroundProcess] = {}
        self._by_session: dict[str, dict[str, BackgroundProcess]] = {}

    def new_id(self) -> str:
        return self._new_id()

    def log_path(self, process_id: str) -> str:
        return os.path.join(self.logs, f"{process_id}.log")

    def __iter__(self) -> Iterator[BackgroundProcess]:
        return iter(self._by_id.values())

    def get(self, ref: str, session_id: str | None = None) -> BackgroundProcess:
        """The process of that id, else of that name (process_names: the rule)."""
        proc = self._by_id.get(ref)
        if proc is None:
            return process_names.by_name(self._by_id.values(), ref, session_id)
        return proc

    def of(self, session_id: str) -> Mapping[str, BackgroundProcess]:
        """One session's processes by id, in start order (read-only to the caller)."""
        return self._by_session.get(session_id, _NONE)

    def listed(self, session_id: str | None) -> list[BackgroundProcess]:
        """The processes of one session (every session's, for None), in start order."""
        return list(self._by_id.values() if session_id is None else self.of(session_id).values())

    def add(self, proc: BackgroundProcess) -> None:
        """Register a started process; then forget the oldest finished ones past
        `remembered`."""
        self._by_id[proc.id] = proc
        self._by_session.setdefault(proc.session.id, {})[proc.id] = proc
        excess = len(self._by_id) - self._remembered
        for process_id, old in list(self._by_id.items()):
            if excess <= 0:
                break
            if old.retired:
                self.forget(process_id)
                excess -= 1

    def forget(self, process_id: str) -> None:
        """Drop a finished process: its task ends and removes its log."""
        proc = self._by_id.pop(process_id)
        mine = self._by_session.get(proc.session.id, {})
        mine.pop(process_id, None)
        if not mine:
            self._by_session.pop(proc.session.id, None)
        proc.forget()
