"""The rules a turn runs under (`AgentConfig`, also how the session is opened) and what it
ends with (`TurnResult`): agent/turns/loop.py keeps them, agent/turns/agent.py opens with
them."""

from __future__ import annotations

import enum

import msgspec

__all__ = ["AgentConfig", "Outcome", "TurnResult"]


class Outcome(enum.Enum):
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    BUDGET_EXHAUSTED = "budget_exhausted"


class AgentConfig(msgspec.Struct, frozen=True):
    """The rules of a turn (its budgets and limits) and how the session is opened."""

    max_steps: int = 20
    wall_s: float = 1800.0
    duplicate_runs: int = 4
    nudge_after: int = 6
    max_tokens: int = 4096
    final_report_tokens: int = 1024
    # The route's context window in tokens; None: what the model adapter says (or guesses).
    context_tokens: int | None = None
    repl_timeout_s: float = 120.0
    network: str | dict = "none"  # or protocol 1.2's {allow: [...]} (toolsd agent --allow)
    env: dict[str, str] = {}
    instructions: str = ""  # added to the system prompt


class TurnResult(msgspec.Struct, frozen=True):
    turn: int
    outcome: str
    reason: str = ""
    text: str = ""  # the model's last text of the turn
    steps: int = 0  # model requests, the final report included
    tool_calls: int = 0
