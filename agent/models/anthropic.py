"""Anthropic Messages, streamed.

The stream is a sequence of typed events (`MessagesAssembler`, pure): `message_start` (input
usage), `content_block_start` (a text block, or a `tool_use` block with its id and name),
`content_block_delta` (`text_delta`, or `input_json_delta` fragments of a tool's input),
`message_delta` (the stop reason and output usage) and `message_stop`. An `error` event ahead
of any content (the API is overloaded) is tried again like a 529; a stream that ends without
`message_stop` was cut off, and is not taken for a whole reply.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from agent.history.messages import ImageRef, LoadedImage, ModelRequest, ToolCall
from agent.models import probe
from agent.models.base import ContextBudget, ModelError, ModelReply, Usage
from agent.models.budget import context_budget
from agent.models.providers import render_anthropic
from agent.models.stream import (
    as_dict,
    as_list,
    as_str,
    load_json,
    tool_call,
)
from agent.models.transport import (
    Endpoint,
    HTTPOptions,
    Transient,
    endpoint_url,
    post_streamed,
)

API_VERSION = "2023-06-01"
_STOPS = {"end_turn": "end", "stop_sequence": "end", "tool_use": "tool_use",
          "max_tokens": "max_tokens"}
_TRANSIENT_ERRORS = {"overloaded_error", "api_error", "rate_limit_error"}


class _Block:
    def __init__(self, kind: str, text: str = "", call_id: str = "", name: str = "",
                 initial: Any = None) -> None:
        self.kind = kind
        self.text = [text] if text else []
        self.id, self.name, self.initial = call_id, name, initial
        self.fragments: list[str] = []


class MessagesAssembler:
    """One reply from Messages stream events (or from one whole message)."""

    def __init__(self, on_text: Callable[[str], None] | None = None) -> None:
        self.started = False
        self._on_text = on_text
        self._blocks: dict[int, _Block] = {}
        self._stop: str | None = None
        self._input: int | None = None
        self._output: int | None = None
        self._done = False

    def feed(self, event: str, data: str) -> None:
        try:
            obj = load_json(data)
        except ValueError:
            raise ModelError(f"the server sent an event that is not JSON: {data[:200]!r}; "
                             "check that the base URL is the Anthropic API") from None
        if not isinstance(obj, dict):
            return
        kind = as_str(obj.get("type")) or event
        if kind == "message_start":
            self._read_usage(as_dict(obj.get("message")).get("usage"))
        elif kind == "content_block_start":
            self._start_block(obj.get("index"), as_dict(obj.get("content_block")))
        elif kind == "content_block_delta":
            self._delta(obj.get("index"), as_dict(obj.get("delta")))
        elif kind == "message_delta":
            self._stop = as_str(as_dict(obj.get("delta")).get("stop_reason")) or self._stop
            self._read_usage(obj.get("usage"))
        elif kind == "message_stop":
            self._done = True
        elif kind == "error":
            self._error(as_dict(obj.get("error")))
        elif kind == "message":
            self._whole(obj)

    def _start_block(self, index: Any, block: dict[str, Any]) -> None:
        if not isinstance(index, int):
            return
        if block.get("type") == "text":
            self._blocks[index] = _Block("text")
            self._text(index, as_str(block.get("text")))
        elif block.get("type") == "tool_use":
            self.started = True
            self._blocks[index] = _Block("tool", call_id=as_str(block.get("id")),
                                         name=as_str(block.get("name")),
                                         initial=block.get("input"))

    def _delta(self, index: Any, delta: dict[str, Any]) -> None:
        block = self._blocks.get(index) if isinstance(index, int) else None
        if block is None:
            return
        if delta.get("type") == "text_delta" and block.kind == "text":
            self._text(index, as_str(delta.get("text")))
        elif delta.get("type") == "input_json_delta" and block.kind == "tool":
            block.fragments.append(as_str(delta.get("partial_json")))

    def _text(self, index: int, text: str) -> None:
        if text:
            self.started = True
            self._blocks[index].text.append(text)
            if self._on_text is not None:
                self._on_text(text)

    def _read_usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        parts = [usage.get(k) for k in ("input_tokens", "cache_creation_input_tokens",
                                         "cache_read_input_tokens")]
        if any(isinstance(p, int) for p in parts):
            self._input = sum(p for p in parts if isinstance(p, int))
        if isinstance(usage.get("output_tokens"), int):
            self._output = usage["output_tokens"]

    def _error(self, error: dict[str, Any]) -> None:
        kind, message = as_str(error.get("type")) or "error", as_str(error.get("message"))
        said = f"{kind}: {message}" if message else kind
        if kind in _TRANSIENT_ERRORS and not self.started:
            raise Transient(said, 529 if kind == "overloaded_error" else None)
        raise ModelError(f"the API reported an error midway ({said}); ask again")

    def _whole(self, message: dict[str, Any]) -> None:
        for i, block in enumerate(as_list(message.get("content"))):
            self._start_block(i, as_dict(block))
        self._stop = as_str(message.get("stop_reason")) or None
        self._read_usage(message.get("usage"))
        self._done = True

    def reply(self) -> ModelReply:
        if not self._done:
            raise Transient("the stream ended before message_stop", connection=True)
        texts: list[str] = []
        calls: list[ToolCall] = []
        seen: set[str] = set()
        for _, block in sorted(self._blocks.items()):
            if block.kind == "text":
                texts.append("".join(block.text))
                continue
            raw = "".join(block.fragments) if block.fragments else block.initial
            calls.append(tool_call(block.id, block.name, raw, seen))
        stop = "tool_use" if calls else _STOPS.get(self._stop or "end_turn", self._stop or "end")
        return ModelReply("".join(texts), calls, stop, Usage(self._input, self._output))


class AnthropicModel:
    """A model behind the Anthropic Messages API (or a server that speaks it).

    `base_url` is the API root, with or without its `/v1`; `key_hint` names where `api_key`
    came from, for the error a refused key gives. `context_tokens` overrides the table.
    `http` says how requests go (client, retries, timeouts).
    """

    provider = "anthropic"

    def __init__(self, model: str, base_url: str = "https://api.anthropic.com",
                 api_key: str | None = None, *, context_tokens: int | None = None,
                 key_hint: str = "$ANTHROPIC_API_KEY", http: HTTPOptions = HTTPOptions()) -> None:
        self.name = model
        self._budget = context_budget(model, context_tokens)
        path = "/messages" if base_url.strip().rstrip("/").endswith("/v1") else "/v1/messages"
        headers = {"anthropic-version": API_VERSION, "Accept": "text/event-stream"}
        if api_key:
            headers["x-api-key"] = api_key
        self._endpoint = Endpoint(endpoint_url(base_url, path), headers, model, key_hint)
        self._http = http

    def context_budget(self) -> ContextBudget:
        return self._budget

    async def unreachable(self) -> str | None:
        """None when the endpoint answers (any HTTP status), else why not. (Its model list
        reports no context window: the catalog says it.)"""
        return await probe.unreachable(self._endpoint.url.removesuffix("/messages") + "/models",
                                       self._endpoint.headers)

    async def complete(self, request: ModelRequest, images: Mapping[ImageRef, LoadedImage],
                       on_text: Callable[[str], None] | None = None) -> ModelReply:
        body = {"model": self.name, **render_anthropic(request, images), "stream": True}
        return await post_streamed(self._endpoint, body, lambda: MessagesAssembler(on_text),
                                   self._http)
