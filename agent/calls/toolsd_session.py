"""The toolsd session under an agent's tools, kept: every request on it goes through
`SessionKeeper.ask`, which reads what the result says besides its answer, and a session found
lost is replaced.

- `host_exec` (docs/protocol.md): the whole list comes with every result while it is not
  empty; a line that was not in the last one is new, and told once: a note for the model
  (`take_notes`) and a report to the owner (`report`), to warn the person.
- A lost session (closed for idleness, its sandbox died, closed by someone else, a daemon
  restarted: `lost`) is replaced by a fresh one on the same workspace with the same options,
  once per loss even when calls meet it side by side (connecting to the socket again when
  the daemon stopped answering); what the model is told of it is the note `replace` returns.
  The owner forgets what lived in the old one (`on_replaced`). When none can be opened,
  `SessionLost`.

Resource handling: the session ends at `close()`, and with it the clients the keeper
connected itself; the client it was given is its owner's.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import trio

from agent.calls.results import host_exec_note, session_lost_text
from toolsd.client import AsyncClient, ToolsdError

__all__ = ["SessionKeeper", "Gone", "SessionLost", "lost"]


class SessionLost(Exception):
    """The session was gone and no new one could be opened, or the new one was lost too
    within the same call; the message says why, in one line for a person."""


class Gone(ToolsdError):
    """A request found its session gone (`lost(error)`): `session` is the one it was sent
    on, `cause` the daemon's (or the client's) error. Its code is `session_closed` whatever
    the cause, so that no tool takes it for one of its own errors (image.read's `not_found`
    of a file)."""

    def __init__(self, session: str, cause: ToolsdError):
        super().__init__("session_closed", cause.message)
        self.session = session
        self.cause = cause

    def twice(self) -> SessionLost:
        """This loss, of a session that replaced a lost one within the same call."""
        return SessionLost(f"the toolsd session {self.session}, opened in place of a lost one, "
                           f"was lost too ({self.cause.message}): not opening another in this "
                           f"call")


def lost(error: ToolsdError) -> bool:
    """Whether `error` says the session is gone: closed (idleness, a dead sandbox), unknown
    to the daemon (closed by someone else, or a daemon that restarted), or no daemon."""
    return (error.code in ("session_closed", "connection_lost")
            or (error.code == "not_found" and error.message.startswith("no session ")))


class SessionKeeper:
    """See the module docstring. Made by `SessionKeeper.open`."""

    def __init__(self, client: AsyncClient, opened: dict, options: dict[str, Any]):
        self.client = client
        self.id: str = opened["session"]
        self.workspace: str = opened["workspace"]
        self.sandbox: str = opened["sandbox"]  # "bwrap", or "none" where it cannot sandbox
        self.options = options  # session.open's, for a session that replaces a lost one
        self.closed = False
        # What the host's git would run, as the last result said it.
        self.host_exec: frozenset[str] = frozenset()
        self._notes: list[str] = []  # for the model, with the next tool result
        # The owner's ear for what a person must know: report(kind, fields), kind
        # "host_exec" (fields: added, session) or "session_replaced" (lost, session, reason,
        # stale).
        self.report: Callable[[str, dict], None] | None = None
        # A person watching (`toolsd agent` on a terminal, where the daemon streams):
        # watch(event) with a shell run's output as it comes. The result is the same.
        self.watch: Callable[[Any], None] | None = None
        # Called as a session is replaced: the owner forgets what lived in it and returns
        # the ids of its background processes (gone with it).
        self.on_replaced: Callable[[], list[str]] = list
        self._replacing = trio.Lock()
        self._lost: dict[str, str] = {}  # a lost session's id -> what the model was told
        self._clients: list[AsyncClient] = []  # connected again after a daemon restart: ours

    @classmethod
    async def open(cls, client: AsyncClient, workspace: str, **options: Any) -> SessionKeeper:
        opened = await client.session_open(os.path.abspath(workspace), **options)
        return cls(client, opened, options)

    async def close(self) -> dict:
        """session.close: every process and REPL of the session ends. Idempotent."""
        if self.closed:
            return {}
        self.closed = True
        with trio.CancelScope(shield=True):
            try:
                return await self.ask("session_close", self.id)
            except ToolsdError:
                return {}  # already gone with its daemon
            finally:
                for client in self._clients:
                    await client.aclose()

    async def ask(self, method: str, *args: Any, **params: Any) -> dict:
        """One request on the session (a client method by name); its `host_exec` is read. A
        session found gone raises Gone (but once the keeper is closing: it is meant to go)."""
        sent_on = self.id
        if method == "shell_run" and self.watch is not None:
            params["on_event"] = self.watch
        try:
            r = await getattr(self.client, method)(*args, **params)
        except ToolsdError as e:
            if self.closed or not lost(e):
                raise
            raise Gone(sent_on, e) from None
        self._saw_host_exec(r.get("host_exec"))
        return r

    async def check(self) -> None:
        """Before a call that has no turn to begin first (`toolsd mcp`'s): a session found
        lost now (the daemon restarted or forgot it, its sandbox died) is replaced before the
        call is sent, so that the call runs in the fresh one, the model told with its result
        (`take_notes`), instead of being cut by the loss. Raises SessionLost as `replace`."""
        try:
            listed = (await self.client.session_list())["sessions"]
        except ToolsdError as e:
            if not lost(e):
                raise
            gone = Gone(self.id, e)
        else:
            mine = next((s for s in listed if s.get("session") == self.id), None)
            if mine is not None and mine.get("alive", True):
                return
            gone = Gone(self.id, ToolsdError("session_closed", (
                f"session {self.id}'s sandbox has died" if mine is not None else
                f"toolsd no longer has session {self.id} (closed, or the daemon restarted)")))
        first = gone.session not in self._lost
        told = await self.replace(gone)
        if first:
            self.note(told)

    def take_notes(self) -> list[str]:
        """What the model is to be told besides a result (host_exec, a session replaced),
        once: the caller puts it where the model reads it."""
        notes, self._notes = self._notes, []
        return notes

    def note(self, text: str) -> None:
        self._notes.append(text)

    def _saw_host_exec(self, listed: Any) -> None:
        """What was not in the last list is new, told once (a line removed and added again is
        new again)."""
        now = [x for x in listed if isinstance(x, str)] if isinstance(listed, list) else []
        added = [line for line in now if line not in self.host_exec]
        self.host_exec = frozenset(now)
        if added:
            self._notes.append(host_exec_note(added))
            self._report("host_exec", added=added, session=self.id)

    def _report(self, kind: str, **fields: Any) -> None:
        if self.report is not None:
            self.report(kind, fields)

    async def replace(self, gone: Gone) -> str:
        """Open a session in place of `gone.session` (once: a call that comes after another
        has replaced it gets the same words), connecting again first if the daemon stopped
        answering; what the model is told. Raises SessionLost when none can be opened.
        Shielded: a session opened is always kept, to be closed."""
        lost_id, cause = gone.session, gone.cause
        with trio.CancelScope(shield=True):
            async with self._replacing:
                if lost_id in self._lost:
                    return self._lost[lost_id]
                if cause.code == "connection_lost":
                    reason = f"toolsd stopped answering: {cause.message}"
                    await self._reconnect(lost_id, reason)
                else:
                    reason = cause.message
                    try:
                        # What is left of a dead sandbox ends; its last host_exec look is read.
                        await self.ask("session_close", lost_id)
                    except ToolsdError:
                        pass  # forgotten already, or the daemon went: session.open will say
                try:
                    opened = await self.client.session_open(self.workspace, **self.options)
                except ToolsdError as e:
                    raise SessionLost(
                        f"the toolsd session {lost_id} was lost ({reason}) and a new one "
                        f"could not be opened on {self.workspace}: {e.message}") from None
                if self.closed:  # close came meanwhile: this one is not wanted either
                    await self.ask("session_close", opened["session"])
                    raise SessionLost(f"the toolsd session {lost_id} was lost as the backend "
                                      f"was closing")
                self.id = opened["session"]
                self.host_exec = frozenset()
                stale = self.on_replaced()
                self._lost[lost_id] = text = session_lost_text(reason, stale)
                self._report("session_replaced", lost=lost_id, session=self.id, reason=reason,
                             stale=stale)
                return text

    async def _reconnect(self, lost_id: str, reason: str) -> None:
        """A new connection to the daemon's socket (a daemon restarted there has forgotten
        every session); raises SessionLost when nothing answers on it."""
        path = self.client.socket_path
        try:
            client = await AsyncClient.connect(self.client.target)  # its token and all
        except (ToolsdError, OSError) as e:
            raise SessionLost(f"the toolsd session {lost_id} was lost ({reason}) and nothing "
                              f"answers at {path} ({e}); start the daemon again") from None
        self._clients.append(client)
        self.client = client
