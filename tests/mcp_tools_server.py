"""An MCP server of the tests (the official SDK's `MCPServer`, stdio) with 30 tools, for
`toolsd agent --mcp`: most of them small and pure, a few the tests lean on:

- `unit_convert` (read-only by its annotations): converts a value, the one a model finds;
- `note_write` (no annotations: it may write): appends a line to the file named by
  $NOTES_FILE;
- `hang_forever` writes its own pid to $HANG_FILE, then waits: a test kills the server
  while the call is in flight.

    python tests/mcp_tools_server.py
"""

from __future__ import annotations

import os

import anyio
from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

server = MCPServer("test-tools")
READ_ONLY = ToolAnnotations(readOnlyHint=True)


@server.tool(annotations=READ_ONLY,
             description="Convert a value between units of length (m, km, mi, ft).")
def unit_convert(value: float, source: str, target: str) -> str:
    metres = {"m": 1.0, "km": 1000.0, "mi": 1609.344, "ft": 0.3048}
    return f"{value * metres[source] / metres[target]:.3f} {target}"


@server.tool(description="Append a line to the notes file.")
def note_write(line: str) -> str:
    with open(os.environ["NOTES_FILE"], "a") as f:
        f.write(line + "\n")
    return "noted"


@server.tool(annotations=READ_ONLY, description="Wait for an event that never comes.")
async def hang_forever() -> str:
    with open(os.environ["HANG_FILE"], "w") as f:
        f.write(str(os.getpid()))
    await anyio.sleep_forever()
    return "never"


TOPICS = ["weather forecast", "stock quote", "calendar event", "email draft", "git blame",
          "docker image", "kubernetes pod", "sql query", "csv column", "json schema",
          "http header", "dns record", "tls certificate", "cron schedule", "regex match",
          "color palette", "font metrics", "audio level", "video frame", "pdf page",
          "zip archive", "npm package", "pypi release", "issue label", "slack message",
          "jira ticket", "time zone"]


def _make(topic: str):
    def tool(query: str) -> str:
        return f"{topic}: nothing about {query}"
    tool.__name__ = topic.replace(" ", "_") + "_lookup"
    return tool


for _topic in TOPICS:
    server.tool(annotations=READ_ONLY, description=f"Look up a {_topic}.")(_make(_topic))


if __name__ == "__main__":
    server.run()
