"""The file tools of agent/calls/backend.py (read_file, write_file, edit_file, find), on the
session's `file.*` methods and commands, so they act with the session's view: a hidden path
is absent, a read-only workspace (plan mode, `writable: false`) refuses.

A write is made in two steps: `prepare` computes the Change (the file's bytes as they were,
the new text, the unified diff a person approves) without touching anything, `apply` writes
it only if the file still holds what the diff was made from (compared by hash), so an
approval never overwrites a change made on disk meanwhile. Auto mode and MCP do both at once.
"""

from __future__ import annotations

import os
import shlex
from typing import Any

import msgspec

from agent.calls.arguments import EditFile, Find, ReadFile, WriteFile, parse_arguments
from agent.calls.diffs import unified
from agent.calls.file_text import EditError, apply_edit, digest, kind_of, numbered
from agent.calls.results import RESULT_CHARS, ToolOutcome, one_line, quoted
from agent.history.messages import ToolCall
from toolsd.client import ToolsdError

__all__ = ["FileTools", "Change"]

READ_CHUNK = 1 << 20  # of a file read_file reads per request
READ_SCAN = 32 << 20  # read_file reads at most this far into a file for `offset`
EDIT_BYTES = 4 << 20  # edit_file loads at most this much
WRITE_CHARS = 4 << 20  # of write_file's content
FIND_RESULTS = 100
FIND_TIMEOUT_S = 60.0
_FALLBACK = open(os.path.join(os.path.dirname(__file__), "..", "..", "driver",
                              "find_fallback.py"), encoding="utf-8").read()


class Change(msgspec.Struct, frozen=True):
    """A write that is ready: `before` is what the file held (its hash; "absent" when it did
    not exist), `after` what it will hold, `diff` what a person is shown."""

    tool: str
    path: str  # as the session sees it
    shown: str  # as the model and the person name it
    before: str
    after: str
    diff: str
    summary: str


class FileTools:
    """Mixed into Backend: needs `self._ask`, `self.session`, `self.resolve`, `self.cwd`,
    `self.workspace`, `self._in_cwd`."""

    # ------------------------------------------------------------ reading

    async def _read_file(self, a: ReadFile) -> ToolOutcome:
        if not a.path.strip():
            return ToolOutcome("read_file: `path` is empty: name the file", is_error=True)
        path = self.resolve(a.path)
        try:
            stat = await self._ask("file_stat", self.session, path)
        except ToolsdError as e:
            return self._file_error("read_file", a.path, e)
        if stat["type"] == "dir":
            return ToolOutcome(f"read_file: {a.path} is a folder; list it with find "
                               f"(glob: \"*\", path: {a.path!r}) or run_terminal ls",
                               is_error=True)
        first = a.offset or 1
        data, eof, offset = b"", False, 0
        try:
            while True:
                r = await self._ask("file_read", self.session, path, offset=offset,
                                    length=READ_CHUNK)
                data += r["data"]
                offset += len(r["data"])
                eof = r["eof"] or not r["data"]
                if offset == len(r["data"]):
                    kind = kind_of(data)
                    if kind is not None:
                        tip = "look at it with read_image" if kind.endswith("image") else \
                            "inspect it with run_terminal (file, xxd | head)"
                        return ToolOutcome(f"read_file: {a.path} is {kind} ({stat['size']} "
                                           f"bytes), not text: {tip}", is_error=True)
                wanted = first + (a.limit or 400)
                if eof or offset >= READ_SCAN or data.count(b"\n") >= wanted:
                    break
        except ToolsdError as e:
            return self._file_error("read_file", a.path, e)
        text = data.decode("utf-8", "replace")
        if not eof:
            text = text[:text.rfind("\n") + 1] or text  # a whole last line, where there is one
        body = numbered(text, first, a.limit, complete=eof)
        if not eof:  # how far the file goes on, which its lines were not all read to tell
            body = body.replace(" shown; read on", f" shown, of {stat['size']} bytes in all; "
                                                   f"read on")
        return ToolOutcome(body)

    # ------------------------------------------------------------ writing

    async def prepare(self, call: ToolCall) -> Change | ToolOutcome:
        """The Change a write_file or edit_file call would make, or what is wrong with it;
        nothing is written."""
        args = parse_arguments(call)
        if isinstance(args, ToolOutcome):
            return args
        try:
            return await self._change(call.name, args)
        except ToolsdError as e:
            if e.code in ("connection_lost", "session_closed"):
                raise
            return self._file_error(call.name, args.path, e)

    async def _change(self, tool: str, a: WriteFile | EditFile) -> Change | ToolOutcome:
        if not a.path.strip():
            return ToolOutcome(f"{tool}: `path` is empty: name the file", is_error=True)
        path = self.resolve(a.path)
        before = await self._whole(tool, a.path, path)
        if isinstance(before, ToolOutcome):
            return before
        old_text = None if before is None else before.decode("utf-8", "replace")
        if tool == "write_file":
            if len(a.content) > WRITE_CHARS:
                return ToolOutcome(f"write_file: content of {len(a.content)} characters is over "
                                   f"{WRITE_CHARS}: write it in parts with run_terminal",
                                   is_error=True)
            after = a.content
            verb = "created" if before is None else "wrote"
            lines = after.count("\n") + (1 if after and not after.endswith("\n") else 0)
            summary = f"{verb} {a.path} ({lines} line{'' if lines == 1 else 's'})"
        else:
            if before is None:
                return ToolOutcome(f"edit_file: {a.path} does not exist; create it with "
                                   f"write_file", is_error=True)
            try:
                after = apply_edit(old_text, a.old, a.new, a.all, a.path)
            except EditError as e:
                return ToolOutcome(str(e), is_error=True)
            n = old_text.count(a.old) if a.all else 1
            summary = f"edited {a.path}: {n} replacement{'s' if n > 1 else ''}"
        return Change(tool=tool, path=path, shown=a.path, before=digest(before), after=after,
                      diff=unified(a.path, old_text, after), summary=summary)

    async def _whole(self, tool: str, shown: str, path: str) -> bytes | None | ToolOutcome:
        """The file's bytes, None when there is none; a ToolOutcome when it is not a text
        file that can be edited."""
        try:
            stat = await self._ask("file_stat", self.session, path)
        except ToolsdError as e:
            if e.code == "not_found":
                return None
            raise
        if stat["type"] == "dir":
            return ToolOutcome(f"{tool}: {shown} is a folder", is_error=True)
        if stat["size"] > EDIT_BYTES:
            return ToolOutcome(f"{tool}: {shown} is {stat['size']} bytes, over {EDIT_BYTES}: "
                               f"change it with run_terminal (sed, a script)", is_error=True)
        r = await self._ask("file_read", self.session, path)
        data = r["data"]
        kind = kind_of(data)
        if kind is not None:
            return ToolOutcome(f"{tool}: {shown} is {kind}, not text: it is not changed",
                               is_error=True)
        return data

    async def apply(self, change: Change) -> ToolOutcome:
        """Write the Change, if the file still holds what its diff was made from."""
        try:
            try:
                now = (await self._ask("file_read", self.session, change.path))["data"]
            except ToolsdError as e:
                if e.code != "not_found":
                    raise
                now = None
            if digest(now) != change.before:
                return ToolOutcome(f"{change.tool}: {change.shown} changed on disk after the "
                                   f"diff was made (by someone or something else): nothing was "
                                   f"written. Read it again and redo the change.",
                                   is_error=True)
            await self._ask("file_write", self.session, change.path,
                            change.after.encode("utf-8"), parents=True)
        except ToolsdError as e:
            if e.code in ("connection_lost", "session_closed"):
                raise
            return self._file_error(change.tool, change.shown, e)
        return ToolOutcome(f"{change.summary}.", edited=[change.path])

    async def _write_file(self, a: WriteFile) -> ToolOutcome:
        change = await self._change("write_file", a)
        return change if isinstance(change, ToolOutcome) else await self.apply(change)

    async def _edit_file(self, a: EditFile) -> ToolOutcome:
        change = await self._change("edit_file", a)
        return change if isinstance(change, ToolOutcome) else await self.apply(change)

    def _file_error(self, tool: str, shown: str, e: ToolsdError) -> ToolOutcome:
        if e.code == "not_found":
            return ToolOutcome(f"{tool}: {quoted(shown)} does not exist (paths are relative to "
                               f"the terminal's folder, {self.cwd})", is_error=True)
        if "read-only" in e.message:
            return ToolOutcome(f"{tool}: the workspace is read-only in this session (plan mode, "
                               f"or a session opened with writable: false): nothing was "
                               f"written", is_error=True)
        return ToolOutcome(f"{tool}: {one_line(e.message, 300)}", is_error=True)

    # ------------------------------------------------------------ find

    async def _find(self, a: Find) -> ToolOutcome:
        if not a.pattern and not a.glob:
            return ToolOutcome("find: give `pattern` (a regex to search contents), `glob` (file "
                               "names, as *.py), or both", is_error=True)
        top = a.path or "."
        if a.path:
            try:
                await self._ask("file_stat", self.session, self.resolve(a.path))
            except ToolsdError as e:
                if e.code != "not_found":
                    raise
                return self._file_error("find", a.path, e)
        q = shlex.quote
        globbed = f" -g {q(a.glob)}" if a.glob else ""
        if a.pattern:
            rg = f"rg -n --null --no-heading --color never{globbed} -e {q(a.pattern)} -- {q(top)}"
        else:
            rg = f"rg --files --color never{globbed} -- {q(top)}"
        fallback = (f"python3 -c {q(_FALLBACK)} {q(a.pattern or '')} {q(a.glob or '')} "
                    f"{q(top)} {FIND_RESULTS}")
        script = (f"if command -v rg >/dev/null 2>&1; then {rg}; else {fallback}; fi "
                  f"| head -n {FIND_RESULTS + 1}")
        command, where = self._in_cwd(script)
        r = await self._ask("shell_run", self.session, command, timeout_s=FIND_TIMEOUT_S,
                            max_output_chars=RESULT_CHARS * 4, **where)
        return ToolOutcome(*find_text(r, a, FIND_RESULTS))


def find_text(r: dict[str, Any], a: Find, limit: int) -> tuple[str, bool]:
    """find's result: `path:line: text` (or paths), at most `limit`, within RESULT_CHARS."""
    out = r["output"]
    if r["timed_out"]:
        return f"find: stopped after {FIND_TIMEOUT_S:g} s: narrow `path` or `glob`", True
    rows = [line for line in out.split("\n") if line]
    if "regex parse error" in out or (r["exit_code"] == 2 and not any("\0" in x for x in rows)):
        return f"find: {one_line(out.strip(), 400) or 'failed'}", True
    more = len(rows) > limit
    shown, used = [], 0
    for row in rows[:limit]:
        if "\0" in row:
            path, _, rest = row.partition("\0")
            number, _, text = rest.partition(":")
            row = f"{path}:{number}: {one_line(text.strip(), 200)}"
        if used + len(row) + 1 > RESULT_CHARS - 200:
            more = True
            break
        shown.append(row)
        used += len(row) + 1
    if not shown:
        what = f"matches of {quoted(a.pattern)}" if a.pattern else "files"
        named = f" named {quoted(a.glob)}" if a.glob else ""
        return f"(no {what}{named} in {a.path or 'the terminal folder'})", False
    text = "\n".join(shown)
    if more:
        text += f"\n[{len(shown)} shown, more not: narrow the pattern, glob or path]"
    return text, False
