"""The tools a request declares, in an order that keeps the provider's cached prefix: the
stable head first, deferred tools after it only once activated. Pure.

- The head: the built-in tools (agent/calls/tools.py), then `tool_search` when there are deferred
  tools. It is the same on every request of a run, so it stays in the cached prefix.
- Deferred tools (an outside MCP server's, agent/calls/mcp_tools.py) are not declared at first;
  `tool_search` finds them by words and activates the ones the model names; those are
  appended after the head, in the order activated, from the next request on.
- Legacy names (`renamed`: old -> current): a call by a tool's former name, from a saved
  conversation, is dispatched as the tool it names now; the old name is never declared.
  Likewise a deferred tool called before it was activated (a saved conversation's) runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import msgspec

from agent.history.messages import ToolSpec

__all__ = ["Catalog", "Deferred", "RENAMED", "TOOL_SEARCH", "SEARCH_LIMIT"]

# Former names of built-in tools -> their names now. Empty while none was renamed: a rename
# adds its line here, so that conversations saved before it go on working.
RENAMED: Mapping[str, str] = {}

SEARCH_LIMIT = 8
ACTIVATE_LIMIT = 16  # in one call: a model that names everything gets the first ones
LISTED_CHARS = 300  # of a description, in a search's list (the whole one comes when active)

TOOL_SEARCH = "tool_search"


def search_spec(count: int, servers: list[str]) -> ToolSpec:
    return ToolSpec(
        name=TOOL_SEARCH,
        description=(
            f"Find more tools: {count} tools of outside servers ({', '.join(servers)}) are "
            f"not listed here. `query`: words for what you need; the best matches come back "
            f"with what they do. `activate`: names of those to use; they can be called from "
            f"your next step."),
        parameters={"type": "object", "properties": {
            "query": {"type": "string"},
            "activate": {"type": "array", "items": {"type": "string"}}}, "required": []},
        read_only=True,
    )


class Deferred(msgspec.Struct, frozen=True):
    """A tool not declared until activated: `spec` as the model sees it (its name made
    unique: mcp__SERVER__TOOL), `server` and `tool` as its server knows it."""

    spec: ToolSpec
    server: str
    tool: str


_WORD = re.compile(r"[a-z0-9]+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


class Catalog:
    """Owns the list of deferred tools and which are active (see the module)."""

    def __init__(self, head: list[ToolSpec], renamed: Mapping[str, str] = RENAMED):
        self.builtin = list(head)
        self.renamed = dict(renamed)
        self.deferred: dict[str, Deferred] = {}
        self.active: list[str] = []
        self.unavailable: dict[str, str] = {}  # server -> why its tools are not here
        self._head: list[ToolSpec] | None = None

    def add(self, entries: list[Deferred]) -> None:
        assert self._head is None, "tools are added before the first request"
        for entry in entries:
            self.deferred.setdefault(entry.spec.name, entry)

    def head(self) -> list[ToolSpec]:
        """The stable head, fixed by the first call."""
        if self._head is None:
            servers = sorted({d.server for d in self.deferred.values()})
            self._head = self.builtin + ([search_spec(len(self.deferred), servers)]
                                         if self.deferred else [])
        return self._head

    def tools(self) -> list[ToolSpec]:
        return self.head() + [self.deferred[name].spec for name in self.active]

    def canonical(self, name: str) -> str:
        return self.renamed.get(name, name)

    def lookup(self, name: str) -> ToolSpec | None:
        """The spec a call by `name` runs as (a legacy name's current tool), declared or
        not; None for no tool."""
        name = self.canonical(name)
        for spec in self.head():
            if spec.name == name:
                return spec
        entry = self.deferred.get(name)
        return entry.spec if entry is not None else None

    def search(self, query: str, limit: int = SEARCH_LIMIT) -> list[Deferred]:
        """The deferred tools that best match the words of `query`: a word in the name
        counts twice, one in the description once; a word of 3 letters or more also matches
        the start of a longer one ("conv" finds "convert")."""
        wanted = _words(query)
        scored = []
        for i, entry in enumerate(self.deferred.values()):
            name = _words(entry.tool) + _words(entry.server)
            text = _words(entry.spec.description)
            score = 0
            for w in wanted:
                def hits(ws: list[str]) -> bool:
                    return any(x == w or (len(w) >= 3 and x.startswith(w)) for x in ws)
                score += 2 * hits(name) + hits(text)
            if score:
                scored.append((-score, i, entry))
        return [entry for *_, entry in sorted(scored, key=lambda s: s[:2])[:limit]]

    def activate(self, names: list[str]) -> tuple[list[str], list[str]]:
        """(activated now or already, unknown names), in the order given."""
        done, unknown = [], []
        for name in names[:ACTIVATE_LIMIT]:
            if name in self.deferred:
                if name not in self.active:
                    self.active.append(name)
                done.append(name)
            else:
                unknown.append(name)
        return done, unknown

    def search_text(self, query: str, names: list[str]) -> tuple[str, bool]:
        """What tool_search answers (its text, whether it is an error)."""
        if not query.strip() and not names:
            return ("tool_search: give `query` (words for what you need) or `activate` "
                    "(names from an earlier search).", True)
        lines: list[str] = []
        found: list[Deferred] = []
        if query.strip():
            found = self.search(query)
            if found:
                lines.append(f"Tools matching {query.strip()!r}:")
                for d in found:
                    state = " (active)" if d.spec.name in self.active else ""
                    about = " ".join(d.spec.description.split())
                    if len(about) > LISTED_CHARS:
                        about = about[:LISTED_CHARS - 3] + "..."
                    lines.append(f"- {d.spec.name}{state}: {about}")
            else:
                lines.append(f"No tool matches {query.strip()!r}.")
            for server, why in sorted(self.unavailable.items()):
                lines.append(f"(The server {server} is unavailable: {why}.)")
        if names:
            done, unknown = self.activate(names)
            if done:
                lines.append(f"Activated: {', '.join(done)}. Call them from your next step.")
            if unknown:
                lines.append(f"Not found: {', '.join(unknown)}; use names from a search.")
            if not done:
                return "\n".join(lines), True
        elif found:
            lines.append("Name the ones you want in `activate`.")
        return "\n".join(lines), False
