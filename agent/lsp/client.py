"""One language server, run inside the agent's toolsd session as a background process and
spoken to over its pipes: frames written with `process.write`, its output read with
`process.output` from an offset of this client's own (the shared read mark stays the model's
and the person's). Its stderr goes to a file in the session's scratch, so that its stdout is
the protocol alone. The messages are agent/lsp/wire.py's.

Pull-based: nothing runs between calls. `start` initializes it, `check` opens (or changes)
a file and waits for the server's publishDiagnostics of it; both end by a deadline the caller
gives. A server that cannot start, exits, floods, garbles, or whose session went away is
FAILED, with the reason a person reads ("no diagnostics: ..."), and is not asked again;
it is stopped when it flooded or garbled (a stopped process, its tree with it).

Resource handling: the process is the session's (it ends with it); `stop` ends it sooner.
"""

from __future__ import annotations

import enum
import shlex
from collections.abc import Callable
from typing import Any

import trio

from agent.lsp.wire import (
    Deframer,
    Flood,
    Garbled,
    Published,
    answer,
    did_change,
    did_open,
    file_uri,
    frame,
    initialize,
    initialized,
    read_published,
)
from toolsd.client import ToolsdError

__all__ = ["LanguageServer", "ServerState", "ServerFailed", "server_name"]

MAX_READ_CHARS = 2_000_000  # the most one process.output gives: a flood past it is a flood
READ_WAIT_S = 2.0
WRITE_PAUSE_S = 0.02  # a pipe full: the server reads slowly


class ServerState(enum.Enum):
    NEW = "new"
    READY = "ready"
    FAILED = "failed"


_MOVES = {
    ServerState.NEW: {ServerState.READY, ServerState.FAILED},
    ServerState.READY: {ServerState.FAILED},
    ServerState.FAILED: set(),
}


class ServerFailed(Exception):
    """The reason, for a person: "pylsp exited (exit code 1) ..."."""


def server_name(argv: list[str]) -> str:
    """What a person calls it: its program, or the script an interpreter runs."""
    words = [w.rsplit("/", 1)[-1] for w in argv]
    if len(words) > 1 and words[0].startswith(("python", "node")) and \
            not words[1].startswith("-"):
        return words[1]
    return words[0]


class LanguageServer:
    def __init__(self, ask: Callable[..., Any], session: str, language: str,
                 argv: list[str], root: str, shown: int):
        self._ask = ask  # a SessionKeeper's ask: one request on the session
        self.session = session
        self.language = language
        self.argv = argv
        self.name = server_name(argv)
        self.root = root
        self.shown = shown
        self.state = ServerState.NEW
        self.reason = ""
        self.id: str | None = None
        self.log = f"/tmp/toolsd-lsp-{language}.log"
        self._offset = 0
        self._deframer = Deframer()
        self._inbox: list[dict] = []
        self._versions: dict[str, int] = {}

    def move(self, to: ServerState, reason: str = "") -> None:
        """The one way its state changes; FAILED is final, and its first reason stays."""
        if self.state is ServerState.FAILED:
            return
        assert to in _MOVES[self.state], f"{self.state} -> {to}"
        self.state, self.reason = to, reason

    def _fail(self, reason: str) -> ServerFailed:
        self.move(ServerState.FAILED, reason)
        return ServerFailed(self.reason)

    async def start(self, deadline: float) -> None:
        assert self.state is ServerState.NEW
        command = f"exec {shlex.join(self.argv)} 2>>{self.log}"
        try:
            r = await self._ask("process_start", self.session, command, stdin="pipe",
                                cwd=self.root, name=f"lsp-{self.language}")
        except ToolsdError as e:
            raise self._fail(f"{self.name} could not start: {e.message}") from None
        self.id = r["id"]
        allowed = deadline - trio.current_time()
        await self._send(initialize(1, self.root))
        reply = await self._wait(lambda m: m.get("id") == 1 and "method" not in m, deadline,
                                 f"answer initialize within {allowed:.0f} s")
        if "error" in reply:
            await self.stop()
            raise self._fail(f"{self.name} refused to initialize: {reply['error']}")
        await self._send(initialized())
        self.move(ServerState.READY)

    async def check(self, path: str, language_id: str, text: str,
                    deadline: float) -> Published:
        """The server's diagnostics of `path` (whose content is `text`) after this edit."""
        assert self.state is ServerState.READY
        version = self._versions.get(path, 0) + 1
        self._versions[path] = version
        await self._send(did_open(path, language_id, version, text) if version == 1
                         else did_change(path, version, text))
        uri = file_uri(path)
        allowed = deadline - trio.current_time()
        published: list[Published] = []

        def mine(message: dict) -> bool:
            p = read_published(message, self.shown)
            if p is not None and p.uri == uri and (p.version is None or p.version >= version):
                published.append(p)
                return True
            return False

        await self._wait(mine, deadline, f"publish diagnostics within {allowed:.0f} s",
                         keep_going=True)
        return published[0]

    async def stop(self) -> None:
        if self.id is not None:
            try:
                await self._ask("process_stop", self.id)
            except ToolsdError:
                pass  # gone with its session

    # ------------------------------------------------------------ the pipes

    async def _send(self, message: Any) -> None:
        data = frame(message)
        while data:
            try:
                r = await self._ask("process_write", self.id, data)
            except ToolsdError as e:
                raise await self._ended(f"its input could not be written ({e.message})")
            data = data[r["written"]:]  # ASCII: a byte is a character
            if data:
                await trio.sleep(WRITE_PAUSE_S)

    async def _wait(self, wanted: Callable[[dict], bool], deadline: float, what: str,
                    keep_going: bool = False) -> dict:
        """The first message `wanted` takes, answering the server's requests meanwhile
        (they would block it); raises ServerFailed at the deadline or at its end. Messages
        read past it wait for the next call."""
        while True:
            while self._inbox:
                message = self._inbox.pop(0)
                reply = answer(message)
                if reply is not None:
                    await self._send(reply)
                    continue
                try:
                    if wanted(message):
                        return message
                except Garbled as e:
                    await self.stop()
                    raise self._fail(f"{self.name} sent {e}") from None
            left = deadline - trio.current_time()
            if left <= 0:
                if keep_going:  # slow this time: asked again at the next edit
                    raise ServerFailed(f"{self.name} did not {what}")
                await self.stop()
                raise self._fail(f"{self.name} did not {what}")
            await self._read(min(left, READ_WAIT_S))

    async def _read(self, wait_s: float) -> None:
        try:
            r = await self._ask("process_output", self.id, since=self._offset, wait_s=wait_s,
                                max_output_chars=MAX_READ_CHARS)
        except ToolsdError as e:
            raise self._fail(f"{self.name} could not be read ({e.message})") from None
        if r["truncated"] or r["dropped_bytes"]:
            await self.stop()
            raise self._fail(f"{self.name} flooded: more than {MAX_READ_CHARS:,} characters "
                             f"of output at once")
        self._offset = r["next"]
        try:
            self._inbox += self._deframer.feed(r["output"].encode("utf-8", "surrogateescape"))
        except (Flood, Garbled) as e:
            await self.stop()
            raise self._fail(f"{self.name} sent {e}") from None
        if r["status"] != "running" and not self._inbox:
            raise await self._ended(f"it exited (exit code {r['exit_code']})"
                                    if r["exit_code"] is not None else
                                    f"it was ended ({r['signal'] or r['status']})")

    async def _ended(self, how: str) -> ServerFailed:
        """Failed for good, with the end of its stderr where there is one."""
        said = ""
        try:
            r = await self._ask("shell_run", self.session,
                                f"tail -c 300 {shlex.quote(self.log)} 2>/dev/null",
                                timeout_s=10)
            said = " ".join(r.get("output", "").split())
        except ToolsdError:
            pass
        return self._fail(f"{self.name} stopped: {how}" + (f"; it said: {said}" if said else ""))
