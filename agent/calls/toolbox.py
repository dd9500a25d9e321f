"""Where a tool call goes: the built-in tools to the backend (agent/calls/backend.py),
`tool_search` to the catalog (agent/calls/catalog.py), an outside server's tool to its MCP client
(agent/calls/mcp_tools.py); a legacy name as the tool it names now. The turn declares
`tools()` on each request and runs each call through `call` (after the gate).

Resource handling: a Toolbox owns its McpTools (their servers end at `aclose()`); the backend
stays the Agent's.
"""

from __future__ import annotations

from typing import Any

import msgspec

from agent.calls.ask_user import ASK_USER, ASK_USER_SPEC, answer_outcome, question_of
from agent.calls.catalog import TOOL_SEARCH, Catalog
from agent.calls.results import RESULT_CHARS, ToolOutcome, clip_text, quoted
from agent.history.messages import ToolCall, ToolSpec

__all__ = ["Toolbox"]


class Toolbox:
    def __init__(self, backend: Any, catalog: Catalog, mcp: Any = None):
        self.backend = backend
        self.catalog = catalog
        self.mcp = mcp
        # A person to ask (agent/calls/ask_user.py): `toolsd agent` on a terminal sets it.
        self.ask_user = None

    def tools(self) -> list[ToolSpec]:
        tools = self.catalog.tools()
        return tools + [ASK_USER_SPEC] if self.ask_user is not None else tools

    async def prepare(self, call: ToolCall):
        """A write_file or edit_file call's Change, to approve before it is applied (or the
        ToolOutcome saying why it cannot be made): agent/calls/file_tools.py."""
        return await self.backend.prepare(call)

    async def call(self, call: ToolCall, change=None) -> ToolOutcome:
        if change is not None:
            return await self.backend.call(call, change)
        if call.name == ASK_USER and self.ask_user is not None:
            question = question_of(call.arguments) if call.error is None else None
            if question is None:
                return ToolOutcome("ask_user: send {\"question\": \"...\"}, the question "
                                   "to ask", is_error=True)
            return answer_outcome(await self.ask_user(question))
        name = self.catalog.canonical(call.name)
        entry = self.catalog.deferred.get(name)
        if name == TOOL_SEARCH or entry is not None:
            if call.error is not None:
                return ToolOutcome(f"Your call of {quoted(call.name)} could not be read: "
                                   f"{call.error}", is_error=True)
            if name == TOOL_SEARCH:
                args = call.arguments
                query = args.get("query") if isinstance(args.get("query"), str) else ""
                names = args.get("activate") if isinstance(args.get("activate"), list) else []
                text, is_error = self.catalog.search_text(
                    query, [n for n in names if isinstance(n, str)])
                return ToolOutcome(clip_text(text, RESULT_CHARS), is_error=is_error)
            return await self.mcp.call(entry, call.arguments)
        if self.catalog.lookup(name) is None and self.catalog.deferred:
            declared = ", ".join(t.name for t in self.catalog.tools())
            return ToolOutcome(f"There is no tool {quoted(call.name)}; the tools declared are "
                               f"{declared}; tool_search finds more by words.", is_error=True)
        if name != call.name:
            call = msgspec.structs.replace(call, name=name)
        return await self.backend.call(call)

    async def aclose(self) -> None:
        if self.mcp is not None:
            await self.mcp.close()
