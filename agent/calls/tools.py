"""The eleven tools a model sees. Their schemas ride on every request (in the cached prefix, but
paid on each turn), so each word here earns its place; tests/test_agent_tools.py prints their
size and keeps it within its budget.

Names and arguments are fixed by the issue (15) and shared with `toolsd mcp`; the backend that
runs them is agent/calls/backend.py, which reads their arguments with agent/calls/arguments.py.
"""

from __future__ import annotations

from agent.history.messages import ToolSpec

__all__ = ["TOOLS", "TOOL_NAMES", "READ_ONLY", "WRITES_FILES", "spec"]


def _schema(required: list[str], **properties: dict) -> dict:
    # No "additionalProperties": Gemini's function declarations refuse it, and the backend
    # ignores arguments it does not know anyway.
    return {"type": "object", "properties": properties, "required": required}


TOOLS: list[ToolSpec] = [
    ToolSpec(
        name="run_terminal",
        description=(
            "Run a bash command in the workspace and get its output (stdout and stderr) and "
            "exit code. Each call is a fresh shell, but `cd` carries over to the next call. "
            "Anything left running in the background is ended: use process_start for servers "
            "and watchers. Long output is cut in the middle; the whole of it is saved to a "
            "file the result names."),
        parameters=_schema(
            ["command"],
            command={"type": "string"},
            timeout_s={"type": "number", "description": "Default 120."},
        ),
    ),
    ToolSpec(
        name="repl",
        description=(
            "Run code in an interpreter that stays alive for the rest of this turn: "
            "variables, imports and loaded data persist between calls, so load once and "
            "query many times. The value of a last expression is shown. Starts fresh on "
            "each new user message."),
        parameters=_schema(
            ["code"],
            code={"type": "string"},
            language={"type": "string", "enum": ["python", "node"],
                      "description": "Default python."},
        ),
    ),
    ToolSpec(
        name="process_start",
        description=(
            "Start a long-running command in the background (a server, a watcher, a long "
            "build). It keeps running across turns. Returns its id for process_output and "
            "process_stop. `name`: an optional label (toolsd ps shows it), usable for the id."),
        parameters=_schema(
            ["command"],
            command={"type": "string"},
            name={"type": "string"},
            tty={"type": "boolean", "description": "Run it on a terminal, to answer its "
                                                   "prompts with process_write."},
        ),
    ),
    ToolSpec(
        name="process_output",
        description=(
            "Output of a background process since the last read, and whether it is still "
            "running. Waits up to wait_s seconds for new output, returning early once the "
            "output matches the regex `until`."),
        parameters=_schema(
            ["id"],
            id={"type": "string"},
            wait_s={"type": "number"},
            until={"type": "string"},
        ),
        read_only=True,
    ),
    ToolSpec(
        name="process_write",
        description=(
            "Type into a background process started with tty: its input, as keys (\\n ends "
            "a line, \\u0003 is Ctrl-C); eof sends Ctrl-D. Read what it says with "
            "process_output."),
        parameters=_schema(["id", "data"], id={"type": "string"}, data={"type": "string"},
                           eof={"type": "boolean"}),
    ),
    ToolSpec(
        name="process_stop",
        description="Stop a background process and everything it started.",
        parameters=_schema(["id"], id={"type": "string"}),
    ),
    ToolSpec(
        name="read_image",
        description=(
            "Look at an image file (PNG, JPEG, GIF, WebP, ...): it is shown to you after the "
            "tool results."),
        parameters=_schema(["path"], path={"type": "string"}),
        read_only=True,
    ),
    ToolSpec(
        name="read_file",
        description="Read a text file, lines numbered. offset: first line; limit: lines.",
        parameters=_schema(["path"], path={"type": "string"}, offset={"type": "integer"},
                           limit={"type": "integer"}),
        read_only=True,
    ),
    ToolSpec(
        name="write_file",
        description="Write a whole file (made with its folders if missing).",
        parameters=_schema(["path", "content"], path={"type": "string"},
                           content={"type": "string"}),
    ),
    ToolSpec(
        name="edit_file",
        description=(
            "Replace the exact text `old` with `new` in a file; `old` must occur once "
            "(all: every occurrence)."),
        parameters=_schema(["path", "old", "new"], path={"type": "string"},
                           old={"type": "string"}, new={"type": "string"},
                           all={"type": "boolean"}),
    ),
    ToolSpec(
        name="find",
        description=(
            "Search file contents by regex `pattern` (path:line: text), or list files by "
            "`glob`; in `path` (default: here). Skips ignored and hidden files."),
        parameters=_schema([], pattern={"type": "string"}, glob={"type": "string"},
                           path={"type": "string"}),
        read_only=True,
    ),
]

TOOL_NAMES = tuple(t.name for t in TOOLS)
READ_ONLY = frozenset(t.name for t in TOOLS if t.read_only)
# Their change is prepared first and shown as a diff in ask mode (agent/calls/file_tools.py).
WRITES_FILES = frozenset({"write_file", "edit_file"})
_BY_NAME = {t.name: t for t in TOOLS}


def spec(name: str) -> ToolSpec | None:
    return _BY_NAME.get(name)
