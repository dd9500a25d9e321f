"""What a request carries of the history: the window of recent turns, and what it costs.

- The window: the six most recent user turns; pictures attached after tool results are not
  turns. Everything before the last `Summary` (agent/conversation/compaction.py) is replaced by it.
- Token counts are estimates (characters / 4, a fixed price per picture); the budget's
  origin (config, provider, or a guess) is carried along and said when it matters.
"""

from __future__ import annotations

import msgspec

from agent.history.messages import ImageRef, Message, ModelRequest, Summary, UserMessage
from agent.models.base import ContextBudget, Model

__all__ = ["IMAGE_TOKENS", "USER_TURNS", "budget_words", "estimate_tokens", "is_turn",
           "message_tokens", "resolve_budget", "window"]

USER_TURNS = 6
# What a picture costs in tokens, as estimated (Anthropic: about width*height/750, so a
# 1568 px picture is some 1,600).
IMAGE_TOKENS = 1600


def window(messages: list[Message], user_turns: int = USER_TURNS) -> list[Message]:
    """What is sent of the history: the last Summary (standing for all before it), then the
    messages from the start of the `user_turns`-th most recent user turn. Pictures attached
    after tool results are user messages, but not turns."""
    start = 0
    summary: list[Message] = []
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], Summary):
            summary, start = [messages[i]], i + 1
            break
    turns = [i for i in range(start, len(messages)) if is_turn(messages[i])]
    if len(turns) > user_turns:
        start = turns[-user_turns]
    return summary + messages[start:]


def is_turn(m: Message) -> bool:
    return isinstance(m, UserMessage) and not m.attachment


_encoder = msgspec.json.Encoder()


def message_tokens(m: Message) -> int:
    images = 0
    if isinstance(m, UserMessage):
        images = sum(1 for p in m.content if isinstance(p, ImageRef))
    return len(_encoder.encode(m)) // 4 + images * IMAGE_TOKENS


def estimate_tokens(request: ModelRequest) -> int:
    """Characters / 4 of what the request is made of, pictures at IMAGE_TOKENS each."""
    fixed = (len(request.system) + len(_encoder.encode(request.tools))) // 4
    return fixed + sum(message_tokens(m) for m in request.messages)


def resolve_budget(configured: int | None, model: Model) -> ContextBudget:
    """Without asking the endpoint (agent/models/probe.py route_budget does)."""
    if configured:
        return ContextBudget(tokens=configured, source="configured", detail="context_tokens")
    return model.context_budget()


def budget_words(budget: ContextBudget) -> str:
    if budget.guessed:
        return (f"{budget.tokens} tokens (a guess: neither the config nor the provider said; "
                f"set context_tokens)")
    return f"{budget.tokens} tokens ({budget.origin}" + \
        (f": {budget.detail})" if budget.detail else ")")
