"""Diagnostics after edits: a file that a tool edited (`file_edited`, the hook the turn calls
for each path a tool result names in `ToolOutcome.edited`) is queued; right before the next
model request the turn drains the queue (`drain`): each file is checked by its language's
server (agent/lsp/servers.py picks it, agent/lsp/client.py runs it in the session), and what
they said becomes one runtime message for the model (`render`, pure).

Only tools that say which files they edited get diagnostics: the file tools. A write made by
`run_terminal` or `repl` is not known to be one, and gets none.

Bounded: a server gets `start_s` to start and `wait_s` per file to publish; at most
`files` files per drain, `shown` diagnostics per file, and the message is within RESULT_CHARS.
A server that is absent, slow, crashing or flooding never blocks the turn: the message says
"no diagnostics: why" for that file, never an invented error.
"""

from __future__ import annotations

import os

import msgspec
import trio

from agent.calls.results import RESULT_CHARS, clip_text
from agent.lsp.client import LanguageServer, ServerFailed, ServerState
from agent.lsp.servers import choices, detect_command, language_of
from agent.lsp.wire import LANGUAGE_IDS, Published
from toolsd.client import ToolsdError

__all__ = ["Diagnostics", "DiagnosticLimits", "Checked", "render"]


class DiagnosticLimits(msgspec.Struct, frozen=True):
    start_s: float = 15.0
    wait_s: float = 5.0
    files: int = 10
    shown: int = 30
    file_bytes: int = 2**20


class Checked(msgspec.Struct, frozen=True):
    """One file's outcome: what its server published, or why there is nothing."""

    path: str  # relative to the workspace where it is in it
    server: str = ""
    published: Published | None = None
    why: str = ""


HEADER = "[Diagnostics of the files you just edited, from their language servers]"


def _line(d) -> str:
    severity = d.severity.name.lower() if d.severity is not None else "problem"
    source = f" [{d.source}]" if d.source else ""
    code = f" ({d.code})" if d.code not in (None, "") else ""
    message = " ".join(str(d.message).split())[:300]
    return f"  {d.range.start.line + 1}:{d.range.start.character + 1} {severity}: " \
           f"{message}{code}{source}"


def render(checked: list[Checked], skipped: int = 0) -> str:
    """The runtime message for the model (pure)."""
    lines = [HEADER]
    for c in checked:
        if c.published is None:
            lines.append(f"{c.path}: no diagnostics: {c.why}")
            continue
        p = c.published
        if not p.total:
            lines.append(f"{c.path} ({c.server}): no problems reported")
            continue
        more = f"; the first {len(p.shown)}" if p.total > len(p.shown) else ""
        lines.append(f"{c.path} ({c.server}): {p.total} problem{'s' * (p.total != 1)}{more}:")
        lines += [_line(d) for d in p.shown]
    if skipped:
        lines.append(f"({skipped} more edited files were not checked)")
    return clip_text("\n".join(lines), RESULT_CHARS)


class Diagnostics:
    """The queue of edited files and the language servers of one Agent's session. The
    servers are processes of the session (they end with it)."""

    def __init__(self, backend, configured: dict[str, list[str]] | None = None,
                 limits: DiagnosticLimits = DiagnosticLimits()):
        self.backend = backend
        self.configured = configured or {}
        self.limits = limits
        self.queue: list[str] = []
        self._servers: dict[str, LanguageServer] = {}
        self._absent: dict[str, str] = {}  # language -> why it has no server

    def file_edited(self, path: str) -> None:
        """The hook: `path` (absolute, or relative to the workspace) was edited."""
        path = os.path.join(self.backend.workspace, path)
        if path not in self.queue:
            self.queue.append(path)

    async def drain(self) -> tuple[str, list[Checked]] | None:
        """The runtime message for what was edited since the last drain, or None."""
        paths, self.queue = self.queue, []
        checked = []
        for path in paths[:self.limits.files]:
            c = await self._check(path)
            if c is not None:
                checked.append(c)
        if not checked:
            return None
        return render(checked, max(0, len(paths) - self.limits.files)), checked

    async def _check(self, path: str) -> Checked | None:
        root = os.path.realpath(self.backend.workspace)
        real = os.path.realpath(path)
        shown = os.path.relpath(real, root) if real.startswith(root + os.sep) else path
        language = language_of(real)
        if language is None:
            return None  # no language server for this kind of file: nothing to say
        if not real.startswith(root + os.sep):
            return Checked(shown, why="the file is outside the workspace")
        try:
            with open(real, "rb") as f:
                data = f.read(self.limits.file_bytes + 1)
        except OSError as e:
            return Checked(shown, why=f"it could not be read ({e.strerror})")
        if len(data) > self.limits.file_bytes:
            return Checked(shown, why=f"the file is over {self.limits.file_bytes:,} bytes")
        server = await self._server(language)
        if isinstance(server, str):
            return Checked(shown, why=server) if server else None
        language_id = LANGUAGE_IDS.get(os.path.splitext(real)[1].lower(), language)
        try:
            published = await server.check(real, language_id, data.decode("utf-8", "replace"),
                                           trio.current_time() + self.limits.wait_s)
        except ServerFailed as e:
            return Checked(shown, server.name, why=str(e))
        except ToolsdError as e:
            return Checked(shown, server.name, why=f"the session did not answer ({e.message})")
        return Checked(shown, server.name, published)

    async def _server(self, language: str) -> LanguageServer | str:
        """The language's server, started; or why there is none ("" for none wanted)."""
        server = self._servers.get(language)
        if server is not None and server.session != self.backend.session:
            server = None  # its session was lost and replaced: a new one in the new session
        if server is not None:
            return server if server.state is ServerState.READY else server.reason
        if language in self._absent:
            return self._absent[language]
        candidates = choices(language, self.configured)
        if not candidates:
            self._absent[language] = ""  # configured `false`
            return ""
        ask, session = self.backend.keeper.ask, self.backend.session
        try:
            r = await ask("shell_run", session, detect_command(candidates), timeout_s=10)
        except ToolsdError as e:
            return f"the session did not answer ({e.message})"
        index = r.get("output", "").strip()
        if not index.isdigit():
            names = ", ".join(c[0] for c in candidates)
            self._absent[language] = (f"no language server for {language} in the session "
                                      f"(looked for {names}; set one in the agent's [lsp] "
                                      f"config)")
            return self._absent[language]
        self._servers[language] = server = LanguageServer(
            ask, session, language, candidates[int(index)], self.backend.workspace,
            self.limits.shown)
        try:
            await server.start(trio.current_time() + self.limits.start_s)
        except ServerFailed as e:
            return str(e)
        except ToolsdError as e:
            server.move(ServerState.FAILED, f"the session did not answer ({e.message})")
            return server.reason
        return server
