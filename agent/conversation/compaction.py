"""Compaction: when the window of the history (agent/conversation/window.py) would exceed the
route's context budget, the older part is summarized by the model in one bounded request and
the turn goes on; if the rest still does not fit, `DoesNotFit`, and the turn fails with the
conversation kept as it was. A server that refuses a request as too long (its window smaller
than the budget said) gets one compacted request more (`force`).
"""

from __future__ import annotations

import json

import msgspec

from agent.conversation.repo_context import cap
from agent.conversation.window import budget_words, estimate_tokens, is_turn, message_tokens, window
from agent.history.messages import (
    AssistantMessage,
    Message,
    ModelRequest,
    Summary,
    Text,
    ToolResult,
    UserMessage,
)
from agent.models.base import ContextBudget, Model

__all__ = ["COMPACT_SYSTEM", "DoesNotFit", "FittedHistory", "fit_history"]

# Compaction keeps at most this share of the budget verbatim, and summarizes the rest.
KEEP_SHARE = 0.5
SUMMARY_TOKENS = 2048
# Each older message is shown to the summarizer within this many characters.
TRANSCRIPT_MESSAGE_CHARS = 2000


class DoesNotFit(Exception):
    """The history cannot be brought within the budget; the message says how far off. (A
    server's own refusal is agent.models.base.ContextOverflow.)"""


class FittedHistory(msgspec.Struct, frozen=True):
    """The messages to send; `summary` and `at`: a compaction to insert in the history at
    that index (before the first message kept verbatim)."""

    messages: list[Message]
    tokens: int
    summary: Summary | None = None
    at: int = 0


async def fit_history(model: Model, history: list[Message], base: ModelRequest,
                      budget: ContextBudget, *, force: bool = False) -> FittedHistory:
    """The window of `history` within `budget` for a request like `base`, compacting once if
    needed (or, with `force`, anyway: the server refused it). Raises DoesNotFit (nothing
    changed) when it cannot fit."""
    messages = window(history)
    tokens = estimate_tokens(_with(base, messages))
    if tokens <= budget.tokens and not force:
        return FittedHistory(messages, tokens)
    fixed = estimate_tokens(_with(base, []))
    cut = _cut(messages, int(budget.tokens * KEEP_SHARE) - fixed)
    if cut is None:  # a long last step: keep less room for the summary
        cut = _cut(messages, budget.tokens - fixed - _summary_tokens(budget))
    if cut is None:
        raise DoesNotFit(
            f"the conversation needs about {tokens} tokens and the model's context budget is "
            f"{budget_words(budget)}; even its last step alone does not fit, so nothing "
            f"older can be summarized away")
    older, kept = messages[:cut], messages[cut:]
    summary = await _summarize(model, older, kept, budget)
    fitted = [summary, *kept]
    new_tokens = estimate_tokens(_with(base, fitted))
    if new_tokens > budget.tokens:
        raise DoesNotFit(
            f"the conversation needs about {tokens} tokens and the model's context budget is "
            f"{budget_words(budget)}; summarizing the older part still left about "
            f"{new_tokens}")
    return FittedHistory(fitted, new_tokens, summary, len(history) - len(kept))


def _with(base: ModelRequest, messages: list[Message]) -> ModelRequest:
    return ModelRequest(system=base.system, messages=messages, tools=base.tools,
                        max_tokens=base.max_tokens)


def _cut(messages: list[Message], room: int) -> int | None:
    """The first index where a verbatim tail can start (an assistant step or a user turn,
    so every tool result stays with its call) whose tail fits in `room` tokens."""
    starts = [i for i in range(1, len(messages))
              if isinstance(messages[i], AssistantMessage) or is_turn(messages[i])]
    tail = 0
    best = None
    for i in range(len(messages) - 1, 0, -1):
        tail += message_tokens(messages[i])
        if tail > room:
            break
        if i in starts:
            best = i
    return best


COMPACT_SYSTEM = (
    "You compact the earlier part of a coding agent's conversation so that it can go on "
    "with less context. Write a summary the agent can continue from: the user's requests "
    "and constraints, what was done and found (files, commands, results, errors, decisions), "
    "and what is still open. Be specific and brief; no preamble.")


async def _summarize(model: Model, older: list[Message], kept: list[Message],
                     budget: ContextBudget) -> Summary:
    room_chars = int(budget.tokens * KEEP_SHARE) * 4
    transcript = _transcript(older)
    if len(transcript) > room_chars:
        transcript = "[... earlier part left out ...]\n" + transcript[-room_chars:]
    request = ModelRequest(system=COMPACT_SYSTEM,
                           messages=[UserMessage([Text(transcript)])],
                           max_tokens=_summary_tokens(budget))
    reply = await model.complete(request, {}, None)
    text = reply.text.strip()
    if not text:
        raise DoesNotFit("the model returned an empty summary when asked to compact the "
                              "conversation")
    prompt = _open_request(older, kept)
    if prompt is not None:
        # The request being worked on is kept word for word: a summary may lose it.
        text += f"\n\nThe user's current request, verbatim:\n{prompt}"
    return Summary(text)


def _summary_tokens(budget: ContextBudget) -> int:
    return min(SUMMARY_TOKENS, max(256, budget.tokens // 8))


def _open_request(older: list[Message], kept: list[Message]) -> str | None:
    if any(is_turn(m) for m in kept):
        return None
    for m in reversed(older):
        if is_turn(m):
            return "\n".join(p.text for p in m.content if isinstance(p, Text))
    return None


def _transcript(messages: list[Message]) -> str:
    lines = []
    for m in messages:
        if isinstance(m, Summary):
            lines.append(m.text)
        elif isinstance(m, UserMessage):
            who = "Attached" if m.attachment else "User"
            lines.append(f"{who}: " + " ".join(
                p.text if isinstance(p, Text) else f"[image {p.path}]" for p in m.content))
        elif isinstance(m, AssistantMessage):
            calls = " ".join(f"[called {c.name} {json.dumps(c.arguments)[:500]}]"
                             for c in m.tool_calls)
            lines.append(f"Assistant: {m.text} {calls}".rstrip())
        elif isinstance(m, ToolResult):
            lines.append(f"Result of {m.name}: {m.text}")
    return "\n\n".join(cap(line, TRANSCRIPT_MESSAGE_CHARS) for line in lines)
