"""Tool call ids unique in a whole conversation, not only in one reply. Pure.

Anthropic refuses a request in which two tool_use blocks share an id, anywhere in the
conversation; OpenAI-compatible servers (llama.cpp, some gateways) number the calls of each
reply from zero, so a conversation made on one and continued on Anthropic (`--continue --api
anthropic`) would hold `call_0` many times. Two places make them unique:

- `fresh_calls`: a reply's calls as they come, an id already used in the conversation given a
  new one, so the call and its result are saved with it (the event log shows the new id);
- `unique_call_ids`: a history as a renderer sends it (older conversations were saved with
  the repeats), each repeated id rewritten in its call and in the result that answers it, the
  same way on every request (a provider's prompt cache sees the same text).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

import msgspec

from agent.history.messages import AssistantMessage, Message, ToolCall, ToolResult

__all__ = ["call_ids", "fresh_calls", "unique_call_ids"]


def call_ids(messages: Iterable[Message]) -> set[str]:
    """Every tool call id in `messages`."""
    return {c.id for m in messages if isinstance(m, AssistantMessage) for c in m.tool_calls}


def fresh_calls(calls: list[ToolCall], used: set[str]) -> list[ToolCall]:
    """`calls` with every id that is in `used` (or repeats among them) replaced by a new one."""
    taken = set(used)
    out = []
    for call in calls:
        if call.id in taken:
            call = msgspec.structs.replace(call, id=_new_id(taken))
        taken.add(call.id)
        out.append(call)
    return out


def _new_id(taken: set[str]) -> str:
    while (cid := "call_" + uuid.uuid4().hex[:24]) in taken:
        pass
    return cid


def unique_call_ids(messages: list[Message]) -> list[Message]:
    """`messages` in canonical order (each assistant message with calls followed by exactly
    one result per call, in call order: agent/models/providers.py's `_canonical`) with each call id
    seen before renamed `<id>_<n>`, in its call and its result alike."""
    every = call_ids(messages)
    seen: set[str] = set()
    out: list[Message] = []
    renamed: list[str | None] = []  # for the results that follow: the new id by position
    for m in messages:
        if isinstance(m, AssistantMessage) and m.tool_calls:
            calls, renamed = [], []
            for call in m.tool_calls:
                new = None
                if call.id in seen:
                    n = 2
                    while f"{call.id}_{n}" in every or f"{call.id}_{n}" in seen:
                        n += 1
                    new = f"{call.id}_{n}"
                    call = msgspec.structs.replace(call, id=new)
                seen.add(call.id)
                calls.append(call)
                renamed.append(new)
            if any(renamed):
                m = msgspec.structs.replace(m, tool_calls=calls)
        elif isinstance(m, ToolResult) and renamed:
            new = renamed.pop(0)
            if new is not None:
                m = msgspec.structs.replace(m, call_id=new)
        else:
            renamed = []
        out.append(m)
    return out
