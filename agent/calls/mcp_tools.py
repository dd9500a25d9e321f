"""Outside MCP servers' tools for `toolsd agent --mcp NAME=COMMAND`, through the official
SDK's client (stdio): each server is started as its COMMAND, initialized, and its tools listed
as deferred tools (agent/calls/catalog.py: found with tool_search, declared once activated).

- A server runs on the host, as the person running the agent, in the workspace, with their
  environment, as any MCP client runs its servers: it is not sandboxed (the commands of the
  built-in tools are). Its stderr goes to `mcp-NAME.log` in the conversation's folder.
- A server that cannot start, or does not answer `initialize` and `tools/list` within
  START_TIMEOUT_S, is reported (`failures`) and its tools are not there; the others are.
- A call runs as the server's tool, within CALL_TIMEOUT_S; its text content is the result
  (other content is named). A server that dies mid-call (or before) gives a tool error that
  says so, and its tools answer so from then on; the turn goes on.
- A tool is read-only only when its server's annotations say so (`readOnlyHint`): that is
  what ask mode and plan mode go by (agent/gates/modes.py).

Resource handling: the servers' processes and SDK sessions live in one trio system task, not
in the caller's cancel scopes (an Agent is opened and closed across different ones);
`close()` ends them (the SDK's transport ends each server's process tree) and waits.
"""

from __future__ import annotations

import enum
import os
import re
from typing import Any

import trio

from agent.calls.catalog import Deferred
from agent.calls.results import RESULT_CHARS, ToolOutcome, clip_text
from agent.history.messages import ToolSpec

__all__ = ["McpTools", "LinkState", "tool_name"]

START_TIMEOUT_S = 20.0
CALL_TIMEOUT_S = 300.0
MAX_TOOLS = 500  # of one server: a server that lists more is cut, and says so
DESCRIPTION_CHARS = 1000


class LinkState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"  # never became ready
    ENDED = "ended"  # was ready, then its connection closed


_MOVES = {
    LinkState.STARTING: {LinkState.READY, LinkState.FAILED},
    LinkState.READY: {LinkState.ENDED},
    LinkState.FAILED: set(),
    LinkState.ENDED: set(),
}


class Link:
    """One server: its command, state, and (while ready) its SDK session."""

    def __init__(self, name: str, argv: list[str]):
        self.name = name
        self.argv = argv
        self.state = LinkState.STARTING
        self.reason = ""
        self.session: Any = None
        self.tools: list[Deferred] = []
        self.settled = trio.Event()  # left STARTING

    def end(self, reason: str) -> None:
        """It stopped, whenever that was: FAILED before it was ready, ENDED after."""
        self.move(LinkState.ENDED if self.state is LinkState.READY else LinkState.FAILED,
                  reason)

    def move(self, to: LinkState, reason: str = "") -> None:
        if to is self.state or self.state in (LinkState.FAILED, LinkState.ENDED):
            return  # the first end is the one told
        assert to in _MOVES[self.state], f"{self.state} -> {to}"
        self.state, self.reason = to, reason
        if to is not LinkState.READY:
            self.session = None
        self.settled.set()


def tool_name(server: str, tool: str, taken: set[str]) -> str:
    """`mcp__SERVER__TOOL` within what providers take (letters, digits, _ and -, at most 64),
    unique among `taken`."""
    base = re.sub(r"[^A-Za-z0-9_-]", "_", f"mcp__{server}__{tool}")[:64]
    name, n = base, 2
    while name in taken:
        name = f"{base[:60]}_{n}"
        n += 1
    taken.add(name)
    return name


def _reason(e: BaseException) -> str:
    if isinstance(e, BaseExceptionGroup):
        return "; ".join(_reason(x) for x in e.exceptions)
    if isinstance(e, FileNotFoundError):
        return f"its command was not found ({e.filename or e})"
    text = str(e) or type(e).__name__
    return " ".join(text.split())[:300]


def result_text(result: Any) -> str:
    """A CallToolResult's content as the text a model reads."""
    parts = []
    for item in result.content or []:
        kind = getattr(item, "type", "")
        if kind == "text":
            parts.append(item.text)
        elif kind == "resource" and getattr(item.resource, "text", None) is not None:
            parts.append(item.resource.text)
        else:
            parts.append(f"[{kind or 'unknown'} content, not shown]")
    if not parts and result.structured_content is not None:
        import json

        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts) or "[no content]"


class McpTools:
    """The outside servers of one Agent (see the module for what it owns)."""

    def __init__(self, servers: dict[str, list[str]], cwd: str, log_dir: str):
        self.links = [Link(name, argv) for name, argv in servers.items()]
        self.cwd = cwd
        self.log_dir = log_dir
        self._closing = trio.Event()
        self._done = trio.Event()
        self._started = False

    async def start(self) -> None:
        """Start every server and wait until each is ready or has failed (bounded)."""
        self._started = True
        trio.lowlevel.spawn_system_task(self._serve, name="toolsd-agent-mcp")
        for link in self.links:
            await link.settled.wait()

    def entries(self) -> list[Deferred]:
        return [d for link in self.links if link.state is LinkState.READY for d in link.tools]

    def failures(self) -> dict[str, str]:
        return {link.name: link.reason for link in self.links if link.state is LinkState.FAILED}

    async def close(self) -> None:
        """End every server (idempotent)."""
        if not self._started:
            return
        with trio.CancelScope(shield=True):
            self._closing.set()
            await self._done.wait()

    async def _serve(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                for link in self.links:
                    nursery.start_soon(self._run, link)
                await self._closing.wait()
                nursery.cancel_scope.cancel()
        finally:
            for link in self.links:
                link.end("the agent is closing")
            self._done.set()

    async def _run(self, link: Link) -> None:
        from mcp.client.session import ClientSession
        from mcp.client.stdio import StdioServerParameters, stdio_client

        params = StdioServerParameters(command=link.argv[0], args=link.argv[1:],
                                       env=dict(os.environ), cwd=self.cwd)
        try:
            with open(os.path.join(self.log_dir, f"mcp-{link.name}.log"), "a") as errlog:
                async with stdio_client(params, errlog=errlog) as (read, write), \
                        ClientSession(read, write) as session:
                    with trio.fail_after(START_TIMEOUT_S):
                        await session.initialize()
                        tools = await self._list(session)
                    link.tools = self._entries(link.name, tools)
                    link.session = session
                    link.move(LinkState.READY)
                    await trio.sleep_forever()
        except trio.TooSlowError:
            link.end(f"it did not answer within {START_TIMEOUT_S:g} s")
        except Exception as e:
            link.end(_reason(e))

    @staticmethod
    async def _list(session) -> list:
        import mcp_types as types

        tools, cursor = [], None
        while len(tools) < MAX_TOOLS:
            page = await session.list_tools(
                params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
            tools += page.tools
            cursor = page.next_cursor
            if not cursor:
                break
        return tools[:MAX_TOOLS]

    @staticmethod
    def _entries(server: str, tools: list) -> list[Deferred]:
        taken: set[str] = set()
        entries = []
        for t in tools:
            schema = t.input_schema if isinstance(t.input_schema, dict) else {}
            spec = ToolSpec(name=tool_name(server, t.name, taken),
                            description=clip_text(t.description or t.name, DESCRIPTION_CHARS),
                            parameters=schema or {"type": "object", "properties": {}},
                            read_only=bool(t.annotations and t.annotations.read_only_hint))
            entries.append(Deferred(spec=spec, server=server, tool=t.name))
        return entries

    async def call(self, entry: Deferred, arguments: dict[str, Any]) -> ToolOutcome:
        link = next(link for link in self.links if link.name == entry.server)
        if link.state is not LinkState.READY:
            return ToolOutcome(f"[{entry.spec.name} cannot run: the MCP server {link.name} "
                               f"is not running ({link.reason}); use other tools]",
                               is_error=True)
        from mcp.shared.exceptions import MCPError

        try:
            with trio.fail_after(CALL_TIMEOUT_S):
                result = await link.session.call_tool(entry.tool, arguments)
        except trio.TooSlowError:
            return ToolOutcome(f"[{entry.spec.name}: the MCP server {link.name} did not answer "
                               f"within {CALL_TIMEOUT_S:g} s]", is_error=True)
        except MCPError as e:
            if "closed" not in str(e).lower():
                return ToolOutcome(clip_text(f"{entry.spec.name}: the MCP server {link.name} "
                                             f"refused the call: {e}", RESULT_CHARS),
                                   is_error=True)
            link.move(LinkState.ENDED, "its connection closed")
            return self._ended(entry, link)
        except Exception as e:  # the transport broke under the call
            link.move(LinkState.ENDED, _reason(e))
            return self._ended(entry, link)
        return ToolOutcome(clip_text(result_text(result), RESULT_CHARS),
                           is_error=bool(result.is_error))

    @staticmethod
    def _ended(entry: Deferred, link: Link) -> ToolOutcome:
        return ToolOutcome(f"[{entry.spec.name}: the MCP server {link.name} ended during the "
                           f"call ({link.reason}); its tools are unavailable for the rest of "
                           f"this run. Go on without them.]", is_error=True)
