"""What the turn loop (agent/turns/loop.py) runs on, and nothing more: the parts of the session it
reads during one turn. The Agent (agent/turns/agent.py) is one; the loop never imports it, so the
session depends on the loop and not the other way round."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from agent.calls.backend import Backend
    from agent.calls.toolbox import Toolbox
    from agent.conversation.store import Conversation
    from agent.gates.modes import ApprovalGate
    from agent.lsp.diagnostics import Diagnostics
    from agent.models.base import ContextBudget, Model
    from agent.turns.rules import AgentConfig
    from agent.turns.undo import Undo

__all__ = ["TurnHost"]


class TurnHost(Protocol):
    """Read live, as the turn goes: the session may replace a part between turns."""

    config: AgentConfig
    conversation: Conversation
    backend: Backend  # the toolsd session the calls run in
    model: Model
    budget: ContextBudget  # the route's context window
    system: str  # the system prompt
    toolbox: Toolbox  # what requests declare, where each call goes
    gate: ApprovalGate  # whether a call runs
    diagnostics: Diagnostics  # of the files a call edited
    undo: Undo | None  # the snapshot before a turn's first write

    def take_steering(self) -> list[str]:
        """The lines typed since the last request, taken."""

    async def drain_diagnostics(self) -> None:
        """The language servers' word on the edited files, into the conversation."""
