"""The Agent: a model, a toolsd session and a conversation, running one turn after another.

One turn's run is agent/turns/loop.py's loop.

What the backend reports for a person (agent/calls/backend.py: what the host's git would run, a
lost session replaced) is logged as an event of the turn, or of none between turns, and
given to the listener of the turn (`on_event`) or else to `Agent.on_event`.

Resource handling: an Agent owns its Backend (the toolsd session: `aclose()` closes it, which
ends every background process), its Conversation (its lock) and, when it made it, its client.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import trio

from agent.calls.backend import Backend
from agent.calls.catalog import RENAMED, Catalog
from agent.calls.mcp_tools import McpTools
from agent.calls.toolbox import Toolbox
from agent.calls.tools import TOOLS
from agent.conversation.repo_context import gather_context
from agent.conversation.store import Conversation, ConversationStore
from agent.conversation.window import resolve_budget
from agent.gates.modes import ApprovalGate, Approver, Mode
from agent.history.messages import AssistantMessage, Text, UserMessage
from agent.lsp.diagnostics import Diagnostics
from agent.models.base import Model
from agent.models.probe import route_budget
from agent.turns.loop import Turn, TurnLoop
from agent.turns.offline import recover_latest
from agent.turns.rules import AgentConfig, TurnResult
from agent.turns.settings import Settings
from agent.turns.undo import Undo
from toolsd.client import AsyncClient

__all__ = ["Agent"]

SYSTEM = """You are a coding agent. You work in the repository below through tools that run \
in a sandbox: the workspace is {workspace}, /tmp is scratch space, and network access is \
{network}.
- run_terminal for commands; repl to explore data or code step by step (its state lasts for \
this turn); process_start / process_output / process_stop for servers and long jobs \
(process_write types into one started with tty); read_image to look at a picture; \
read_file, find, edit_file (exact text) and write_file for files, rather than cat, grep or sed.
- Check what your actions did. End the turn with a short answer: what you did and found.{mode}
{instructions}
{context}"""

def network_words(network) -> str:
    if isinstance(network, dict):  # protocol 1.2 "egress"
        return ("limited to " + ", ".join(network.get("allow", [])) + " (other hosts are "
                "refused; a refusal is named in the tool result)")
    return "on" if network == "host" else "off"


MODE_NOTES = {
    Mode.PLAN: "\n- Plan mode: the workspace is read-only. Investigate and propose changes; "
               "do not write files.",
    Mode.ASK: "\n- The user approves commands, code and file changes before they run; a "
              "declined call is their decision, not an error to work around.",
    Mode.AUTO: "",
}


class Agent:
    """A model, a toolsd session and a conversation; `run_turn` for each prompt.

    Both `toolsd agent` (a person at a terminal) and `toolsd mcp` build on it: open with
    `await Agent.open(workspace, model, ...)`, run turns, `await agent.aclose()` (or use it
    as an async context manager)."""

    def __init__(self, *, model: Model, backend: Backend, conversation: Conversation,
                 gate: ApprovalGate, config: AgentConfig, system: str, client: AsyncClient,
                 own_client: bool):
        self.model = model
        self.backend = backend
        self.conversation = conversation
        self.gate = gate
        self.config = config
        self.system = system
        self.budget = resolve_budget(config.context_tokens, model)
        # What the model's requests declare and where each call goes (agent/calls/toolbox.py).
        self.toolbox = Toolbox(backend, Catalog(TOOLS))
        gate.lookup = self.toolbox.catalog.lookup
        self.notes: list[str] = []  # for a person, as it opened (a server that did not start)
        self.diagnostics = Diagnostics(backend)  # of edited files, before the next request
        self._client = client
        self._own_client = own_client
        self._scope: trio.CancelScope | None = None
        self._closed = False
        self._turn: int | None = None  # the number of the turn in flight
        self._listener: Callable[[dict], None] | None = None  # the turn in flight's
        # Events that come outside a turn (the backend's reports at close) go here.
        self.on_event: Callable[[dict], None] | None = None
        backend.report = self._report
        self.steering: list[str] = []  # typed during the turn, for its next request
        # Snapshots for /undo (agent/turns/undo.py); None where the workspace is not on this
        # machine.
        self.undo = Undo(backend.workspace, conversation.folder)

    def steer(self, line: str) -> None:
        """A line the person typed while the turn runs (agent/turns/steering.py): logged, and given
        to the model before its next request."""
        self.steering.append(line)
        self._report("steer", {"text": line})

    def take_steering(self) -> list[str]:
        lines, self.steering = self.steering, []
        return lines

    @classmethod
    async def open(cls, workspace: str, model: Model, *, mode: Mode | str = Mode.ASK,
                   approve: Approver | None = None, config: AgentConfig | None = None,
                   client: AsyncClient | None = None, socket: str | None = None,
                   resume: str | None = None, store_root: str | None = None,
                   provider: str | None = None, settings: Settings | None = None,
                   renamed: Mapping[str, str] = RENAMED) -> Agent:
        """Open a toolsd session on `workspace` (read-only in plan mode) and a conversation:
        a new one, or with `resume` the one of that id ("latest": the most recent); and the
        outside MCP servers of `settings`, whose tools are deferred (agent/calls/catalog.py).
        `renamed`: former tool names still dispatched (a saved conversation's)."""
        config = config or AgentConfig()
        settings = settings or Settings()
        gate = ApprovalGate(mode, approve)
        store = ConversationStore(workspace, store_root)
        own_client = client is None
        backend = mcp = conversation = None
        earlier: list[str] = []
        try:
            if client is None:
                client = await AsyncClient.connect(socket)
            backend = await Backend.open(
                client, workspace, writable=gate.mode is not Mode.PLAN,
                network=config.network, env=config.env,
                provider=provider or model.provider,
                repl_timeout_s=config.repl_timeout_s)
            context = await gather_context(backend)
            # Last, so that an agent that could not start leaves no empty conversation.
            if resume == "latest":
                conversation = store.latest() or store.new()
            elif resume:
                conversation = store.open(resume)
            else:
                earlier = recover_latest(store)  # what a killed run left, said now
                conversation = store.new()
            if settings.mcp:
                mcp = McpTools(settings.mcp, os.path.abspath(workspace), conversation.folder)
                await mcp.start()
        except BaseException:
            with trio.CancelScope(shield=True):
                if mcp is not None:
                    await mcp.close()
                if conversation is not None:
                    conversation.close()
                if backend is not None:
                    await backend.aclose()
                if own_client and client is not None:
                    await client.aclose()
            raise
        system = SYSTEM.format(workspace=backend.workspace, mode=MODE_NOTES[gate.mode],
                               network=network_words(config.network),
                               instructions=config.instructions, context=context)
        agent = cls(model=model, backend=backend, conversation=conversation, gate=gate,
                    config=config, system=system, client=client, own_client=own_client)
        if mcp is not None:
            catalog = Catalog(TOOLS, renamed)
            catalog.add(mcp.entries())
            catalog.unavailable = mcp.failures()
            # A resumed conversation's outside tools are declared again, in the order it
            # first called them: the model goes on with the tools it was using.
            catalog.activate(list(dict.fromkeys(
                c.name for m in conversation.messages if isinstance(m, AssistantMessage)
                for c in m.tool_calls if c.name in catalog.deferred)))
            agent.toolbox = Toolbox(backend, catalog, mcp)
            agent.notes = [f"toolsd agent: the MCP server {name} did not start: {why} (its "
                           f"tools are not available)" for name, why in mcp.failures().items()]
        elif renamed:
            agent.toolbox = Toolbox(backend, Catalog(TOOLS, renamed))
        gate.lookup = agent.toolbox.catalog.lookup
        agent.diagnostics = Diagnostics(backend, settings.lsp)
        agent.notes[:0] = earlier
        # The endpoint's own report of its window, where it gives one (bounded: a probe).
        agent.budget = await route_budget(config.context_tokens, model)
        return agent

    async def __aenter__(self) -> Agent:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """End the session (every background process and REPL in it), release the
        conversation. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            try:
                await self.toolbox.aclose()  # the outside MCP servers
                await self.backend.aclose()
            finally:
                self.conversation.close()
                if self._own_client:
                    await self._client.aclose()

    def _report(self, kind: str, fields: dict) -> None:
        event = self.conversation.log(kind, self._turn, **fields)
        listener = self._listener or self.on_event
        if listener is not None:
            listener(event)

    async def drain_diagnostics(self) -> None:
        """The language servers' word on the files edited since the last request, as one
        runtime message in the conversation (agent/lsp/diagnostics.py); nothing when none was."""
        drained = await self.diagnostics.drain()
        if drained is None:
            return
        text, checked = drained
        self.conversation.append(UserMessage([Text(text)], attachment=True))
        self._report("diagnostics", {"files": [
            {"path": c.path, "server": c.server, "why": c.why,
             "count": c.published.total if c.published is not None else None}
            for c in checked]})

    def cancel(self) -> None:
        """Cancel the turn in flight (it ends `interrupted`); nothing if none is."""
        if self._scope is not None:
            self._scope.cancel()

    async def run_turn(self, prompt: str, *, on_event: Callable[[dict], None] | None = None,
                       on_text: Callable[[str], None] | None = None) -> TurnResult:
        """Run one turn for `prompt`. Returns its result whatever its outcome; a
        cancellation from outside (an enclosing scope) is recorded, then propagates."""
        if self._closed:
            raise RuntimeError("this agent is closed; open a new one")
        if self._scope is not None:
            raise RuntimeError("a turn is already running on this agent")
        turn = Turn(self.conversation.next_turn(), self.config.wall_s)
        on_event = on_event or self.on_event
        self._turn, self._listener = turn.number, on_event
        with trio.CancelScope() as self._scope:
            try:
                await TurnLoop(self, turn, on_event, on_text).run(prompt)
            finally:
                self._scope = self._turn = self._listener = None
        return turn.result()
