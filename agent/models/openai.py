"""OpenAI-compatible chat completions, as OpenAI, llama.cpp, vLLM, Ollama and gateways serve it.

The servers differ in what they stream, so the reply is read defensively (`ChatAssembler`,
pure): tool calls are put together by their `index` (the name comes in the first fragment
only, the arguments in many), or by id and name where a server sends no index; a call without
an id gets one; arguments may come as a JSON string or as an object; a call whose arguments
cannot be read becomes a `ToolCall` with `error` set, answered to the model instead of run;
and tool calls are found by their presence, since some servers end with `finish_reason:
"stop"` after calling tools. A server that ignores `stream` and answers with one JSON object
is read the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from agent.history.messages import ImageRef, LoadedImage, ModelRequest, ToolCall
from agent.models import probe
from agent.models.base import ContextBudget, ModelError, ModelReply, Usage
from agent.models.budget import context_budget
from agent.models.providers import render_openai_chat
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
    error_detail,
    post_streamed,
)

_STOPS = {"stop": "end", "length": "max_tokens", "tool_calls": "end", "function_call": "end"}


class _Call:
    def __init__(self) -> None:
        self.id = ""
        self.name = ""
        self.fragments: list[str] = []
        self.whole: Any = None  # arguments a server sent as an object, not as text


class ChatAssembler:
    """One reply from chat-completion chunks (or from one whole completion)."""

    def __init__(self, on_text: Callable[[str], None] | None = None) -> None:
        self.started = False
        self._on_text = on_text
        self._text: list[str] = []
        self._calls: list[_Call] = []
        self._by_index: dict[int, _Call] = {}
        self._finish: str | None = None
        self._usage = Usage()
        self._received = False
        self._ended = False  # [DONE] or a finish_reason came: the reply was not cut off

    def feed(self, event: str, data: str) -> None:
        if data.strip() == "[DONE]":
            self._ended = True
            return
        try:
            chunk = load_json(data)
        except ValueError:
            raise ModelError(f"the server sent a reply that is not JSON: {data[:200]!r}; "
                             "check that the base URL is an OpenAI-compatible API") from None
        if not isinstance(chunk, dict):
            raise ModelError(f"the server sent {data[:200]!r} where a JSON object belongs; "
                             "check that the base URL is an OpenAI-compatible API")
        self._received = True
        if chunk.get("error"):
            raise ModelError(f"the server reported an error: {error_detail(data)}")
        for choice in as_list(chunk.get("choices")):
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                self._feed_choice(choice)
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage = Usage(_int(usage.get("prompt_tokens")),
                                _int(usage.get("completion_tokens")))

    def _feed_choice(self, choice: dict[str, Any]) -> None:
        whole = "delta" not in choice
        self._ended = self._ended or whole
        delta = as_dict(choice.get("delta") or choice.get("message"))
        content = as_str(delta.get("content"))
        if content:
            self.started = True
            self._text.append(content)
            if self._on_text is not None:
                self._on_text(content)
        for fragment in as_list(delta.get("tool_calls")):
            if isinstance(fragment, dict):
                self.started = True
                self._feed_call(fragment, whole)
        if as_str(choice.get("finish_reason")):
            self._finish = choice["finish_reason"]
            self._ended = True

    def _feed_call(self, fragment: dict[str, Any], whole: bool) -> None:
        fn = as_dict(fragment.get("function"))
        call_id, name = as_str(fragment.get("id")), as_str(fn.get("name"))
        index = fragment.get("index")
        if isinstance(index, int) and not whole:
            call = self._by_index.get(index)
            if call is None:
                call = self._by_index[index] = self._new_call()
        elif (whole or not self._calls
              or (call_id and call_id != self._calls[-1].id)
              or (name and self._calls[-1].name)):
            # No index: a new id, or a name (sent with a call's first fragment only), starts
            # the next call; anything else continues the last one.
            call = self._new_call()
        else:
            call = self._calls[-1]
        if call_id and not call.id:
            call.id = call_id
        if name and not call.name:
            call.name = name
        arguments = fn.get("arguments")
        if isinstance(arguments, str):
            call.fragments.append(arguments)
        elif arguments is not None:
            call.whole = arguments

    def _new_call(self) -> _Call:
        call = _Call()
        self._calls.append(call)
        return call

    def reply(self) -> ModelReply:
        if not self._ended:
            raise Transient("the stream ended before [DONE]" if self._received else
                            "the reply ended before its first chunk", connection=True)
        calls: list[ToolCall] = []
        seen: set[str] = set()
        for c in self._calls:
            raw = c.whole if c.whole is not None else "".join(c.fragments)
            calls.append(tool_call(c.id, c.name, raw, seen))
        stop = "tool_use" if calls else _STOPS.get(self._finish or "stop", self._finish or "end")
        return ModelReply("".join(self._text), calls, stop, self._usage)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) else None


class OpenAIChatModel:
    """A model behind an OpenAI-compatible `/chat/completions` endpoint.

    `base_url` is the API root (".../v1"); `api_key` is sent as a bearer token when given
    (local servers take none); `key_hint` names where it came from, for the error a refused
    key gives. `context_tokens` is the context size when known (config, or how the server was
    started). `http` says how requests go (client, retries, timeouts).
    """

    provider = "openai"

    def __init__(self, model: str, base_url: str = "https://api.openai.com/v1",
                 api_key: str | None = None, *, context_tokens: int | None = None,
                 key_hint: str = "$OPENAI_API_KEY", http: HTTPOptions = HTTPOptions()) -> None:
        self.name = model
        self._budget = context_budget(model, context_tokens)
        headers = {"Accept": "text/event-stream"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._endpoint = Endpoint(endpoint_url(base_url, "/chat/completions"), headers, model,
                                  key_hint)
        self._http = http

    def context_budget(self) -> ContextBudget:
        return self._budget

    def _root(self) -> str:
        return self._endpoint.url.removesuffix("/chat/completions")

    async def reported_budget(self) -> ContextBudget | None:
        """The window the server reports for this model: its model list (vLLM, OpenRouter,
        LM Studio, Groq) or llama.cpp's /props; None when it says nothing."""
        root = self._root()
        urls = [root + "/models", root.removesuffix("/v1") + "/props"]
        return await probe.reported_budget(urls, self._endpoint.headers, self.name)

    async def unreachable(self) -> str | None:
        """None when the endpoint answers (any HTTP status), else why not."""
        return await probe.unreachable(self._root() + "/models", self._endpoint.headers)

    async def complete(self, request: ModelRequest, images: Mapping[ImageRef, LoadedImage],
                       on_text: Callable[[str], None] | None = None) -> ModelReply:
        body = {"model": self.name, **render_openai_chat(request, images), "stream": True,
                "stream_options": {"include_usage": True}}
        return await post_streamed(self._endpoint, body, lambda: ChatAssembler(on_text), self._http)
