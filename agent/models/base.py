"""What every model adapter offers the turn loop, whatever its wire.

An adapter (`openai.py`, `anthropic.py`, `scripted.py`) turns a `ModelRequest` into the
provider's request (through `agent/models/providers.py`), sends it, and assembles the reply, calling
`on_text` with the text as it streams. Errors a person must act on (wrong URL, key, model)
raise `ModelError` with a one-line message; transient ones are retried inside the adapter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import msgspec

from agent.history.messages import ImageRef, LoadedImage, ModelRequest, ToolCall


class Usage(msgspec.Struct, frozen=True):
    input_tokens: int | None = None
    output_tokens: int | None = None


class ModelReply(msgspec.Struct, frozen=True):
    """`stop`: "end" (the model finished), "tool_use" (it asked for tools), "max_tokens" (cut
    off), or the provider's own word where none of these fits. Tool calls are found by their
    presence, never by `stop` alone."""

    text: str = ""
    tool_calls: list[ToolCall] = []
    stop: str = "end"
    usage: Usage = Usage()


class ModelError(Exception):
    """A model request failed for good; the message is one line that says what to do."""


class ContextBudget(msgspec.Struct, frozen=True):
    """How many tokens the route takes, and where that figure came from: `source` is
    "configured" (`--context-tokens`, the agent's config), "endpoint" (the server's own
    report), "catalog" (a table of known hosted models) or "fallback" (a guess; `guessed`
    then); `detail` says which (the option, the field the server reported, the model's
    prefix, why none applied). agent/models/limits.py words it for a person."""

    tokens: int
    guessed: bool = False
    source: str = ""  # "" in a budget made by hand: "fallback" if guessed, else "configured"
    detail: str = ""

    @property
    def origin(self) -> str:
        return self.source or ("fallback" if self.guessed else "configured")


class Model(Protocol):
    name: str
    # The request shape it sends, one of agent.models.providers.PROVIDERS: what the pictures of a
    # request are fitted to.
    provider: str

    def context_budget(self) -> ContextBudget: ...

    async def complete(
        self,
        request: ModelRequest,
        images: Mapping[ImageRef, LoadedImage],
        on_text: Callable[[str], None] | None = None,
    ) -> ModelReply: ...


class ContextOverflow(ModelError):
    """The server refused the request as larger than the model's context window: the turn
    loop may compact the history and ask again."""


class Unreachable(ModelError):
    """Nothing answered at the endpoint (the connection was refused): nothing of the request
    was sent, so it can be sent again as it is once the endpoint answers
    (agent/turns/offline.py)."""
