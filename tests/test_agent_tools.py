"""The eleven model-visible tools: exact names and arguments, and what their schemas cost."""

from __future__ import annotations

import msgspec

from agent.calls.tools import READ_ONLY, TOOLS

# Seven tools (process_write and process_start's tty included) stayed under 900 tokens of
# schema; the four file tools (issue 27) raised it.
TOKEN_LIMIT = 950


def tokens(tool) -> int:
    """Characters / 4 of what a provider is sent for the tool."""
    return len(msgspec.json.encode(
        {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}
    )) // 4


def test_the_tools_with_the_issue_names_and_arguments():
    shapes = {t.name: (sorted(t.parameters["properties"]), t.parameters["required"])
              for t in TOOLS}
    assert shapes == {
        "run_terminal": (["command", "timeout_s"], ["command"]),
        "repl": (["code", "language"], ["code"]),
        "process_start": (["command", "name", "tty"], ["command"]),
        "process_write": (["data", "eof", "id"], ["id", "data"]),
        "process_output": (["id", "until", "wait_s"], ["id"]),
        "process_stop": (["id"], ["id"]),
        "read_image": (["path"], ["path"]),
        "read_file": (["limit", "offset", "path"], ["path"]),
        "write_file": (["content", "path"], ["path", "content"]),
        "edit_file": (["all", "new", "old", "path"], ["path", "old", "new"]),
        "find": (["glob", "path", "pattern"], []),
    }
    repl = next(t for t in TOOLS if t.name == "repl")
    assert repl.parameters["properties"]["language"]["enum"] == ["python", "node"]
    assert READ_ONLY == {"process_output", "read_image", "read_file", "find"}


def test_schemas_cost_within_the_budget():
    sizes = {t.name: tokens(t) for t in TOOLS}
    total = sum(sizes.values())
    print(f"\ntool schemas: {total} tokens (chars/4) in all: {sizes}")
    assert total < TOKEN_LIMIT
