"""A conversation as the agent keeps it: provider-neutral and serialisable.

One history, rendered into each provider's request shape by `agent/models/providers.py` (pure), sent
by an adapter of `agent/models/`. Stored as msgpack or JSON with the tagged Structs below, so a
conversation saved in one run is resumed in the next.

Images are kept as paths (as the session sees them), never as bytes: the picture is read when a
request is rendered and rides on a user message after the tool result that asked for it.
"""

from __future__ import annotations

from typing import Any

import msgspec


class Text(msgspec.Struct, tag="text", frozen=True):
    text: str


class ImageRef(msgspec.Struct, tag="image", frozen=True):
    """A picture by its path in the session, read at render time; `max_dim` and `max_bytes`
    are what it is fitted to when read (the provider's per-image limits)."""

    path: str
    max_dim: int = 1568
    max_bytes: int = 3_750_000


Part = Text | ImageRef


class ToolCall(msgspec.Struct, frozen=True):
    """A tool call the model asked for. `error` is set, and `arguments` empty, when the model's
    arguments could not be read (malformed JSON, not an object): the call is answered to the
    model with that error instead of being run."""

    id: str
    name: str
    arguments: dict[str, Any] = {}
    error: str | None = None


class UserMessage(msgspec.Struct, tag="user", frozen=True):
    """What a person said, or (`attachment=True`) pictures riding after tool results: an
    attachment is not a user turn and never counts in the history window."""

    content: list[Part]
    attachment: bool = False


class AssistantMessage(msgspec.Struct, tag="assistant", frozen=True):
    text: str = ""
    tool_calls: list[ToolCall] = []


class ToolResult(msgspec.Struct, tag="tool", frozen=True):
    call_id: str
    name: str
    text: str
    is_error: bool = False


class Summary(msgspec.Struct, tag="summary", frozen=True):
    """Older history replaced by compaction: rendered as a user message that says so."""

    text: str


Message = UserMessage | AssistantMessage | ToolResult | Summary


class ToolSpec(msgspec.Struct, frozen=True):
    """A model-visible tool: `parameters` is a JSON Schema object."""

    name: str
    description: str
    parameters: dict[str, Any]
    read_only: bool = False


class ModelRequest(msgspec.Struct, frozen=True):
    """Everything one model request is made of, before a provider's shape is applied."""

    system: str
    messages: list[Message]
    tools: list[ToolSpec] = []
    max_tokens: int = 4096


class LoadedImage(msgspec.Struct, frozen=True):
    """An ImageRef read for rendering; `missing` names why it could not be read (the file
    vanished between turns), and the renderer then says so in text instead."""

    media_type: str = ""
    data: bytes = b""
    width: int = 0
    height: int = 0
    missing: str | None = None


history_encoder = msgspec.json.Encoder()
history_decoder = msgspec.json.Decoder(list[Message])
