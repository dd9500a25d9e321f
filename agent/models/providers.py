"""Request shapes of the providers, rendered from one history (agent/history/messages.py). Pure.

Each provider has limits on the pictures a request may carry; an image is fitted to them when
it is read (toolsd's image.read downscales and re-encodes), so an oversized picture never
enters a request and fails every later one.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from typing import Any

from agent.history.call_ids import unique_call_ids
from agent.history.messages import (
    AssistantMessage,
    ImageRef,
    LoadedImage,
    Message,
    ModelRequest,
    Summary,
    Text,
    ToolCall,
    ToolResult,
    UserMessage,
)

PROVIDERS = ("anthropic", "openai")

# Anthropic: 8000 px a side and 5 MB per image, 2000 px a side once a request holds more than
# 20 images. 5 MB is of the base64 text, hence 3.75 MB of bytes. 1568 px is Anthropic's own
# advice (larger images are downscaled by the API anyway, at the cost of latency).
_DEFAULT_DIM = 1568
_DEFAULT_BYTES = 3_750_000
_MANY_IMAGES = 20
_MANY_IMAGES_DIM = 2000


# What the pictures of one request may come to together: Anthropic takes at most 100 images
# and 32 MB a request, OpenAI 500 images and 50 MB. The sizes are of the base64 text, with
# room left for the rest of the request. Over them, a request fails,
# and so does every later one while those pictures are in the history's window.
_REQUEST_IMAGES = {"anthropic": (100, 24_000_000), "openai": (500, 40_000_000)}
LEFT_OUT = ("the pictures read after it already fill what one request can carry; read it "
            "again to see it")


def image_limits(provider: str, images_in_request: int = 1) -> tuple[int, int]:
    """(max_dim, max_bytes) for one picture in a request of `provider` holding that many."""
    if provider not in PROVIDERS:
        raise ValueError(f"unknown provider {provider!r}; expected one of {', '.join(PROVIDERS)}")
    max_dim = _DEFAULT_DIM
    if images_in_request > _MANY_IMAGES:
        max_dim = min(max_dim, _MANY_IMAGES_DIM)
    return max_dim, _DEFAULT_BYTES


def within_request(provider: str,
                   images: list[tuple[ImageRef, LoadedImage]]) -> dict[ImageRef, LoadedImage]:
    """`images` (in the order of the history) as one request of `provider` can carry them: the
    most recent kept until the count or the size its requests take is reached; older ones
    become `missing` (LEFT_OUT), which the renderers say in text."""
    most, room = _REQUEST_IMAGES[provider]
    fitted: dict[ImageRef, LoadedImage] = {}
    for ref, image in reversed(images):
        if image.missing is None:
            cost = (len(image.data) + 2) // 3 * 4
            if most > 0 and cost <= room:
                most, room = most - 1, room - cost
            else:
                image = LoadedImage(missing=LEFT_OUT)
        fitted[ref] = image
    return {ref: fitted[ref] for ref, _ in images}


# --- Request rendering ---------------------------------------------------------------------
#
# Every renderer first puts the history into one canonical order (_canonical), so that what
# the providers refuse cannot reach them whatever order the turn loop appended in: each
# assistant message with tool calls is followed by exactly one result per call, in call order,
# and the pictures those calls asked for come after all of them. That is the one place an
# image may ride in both shapes (only Anthropic takes one inside a tool result), and the
# order Anthropic and OpenAI both insist on (results right after their calls).

Images = Mapping[ImageRef, LoadedImage]

_NO_OUTPUT = "(no output)"
_NOT_RUN = "This call was not run: the turn ended before its result came back."
_NOT_LOADED = "it was not loaded for this request"


def summary_text(summary: Summary) -> str:
    return ("Summary of earlier work in this conversation (the older messages were replaced "
            f"by it to save room):\n{summary.text}")


def missing_image_text(path: str, reason: str) -> str:
    return f"[The image {path} could not be attached: {reason}.]"


def arguments_json(call: ToolCall) -> str:
    return json.dumps(call.arguments, ensure_ascii=False, separators=(",", ":"))


def _canonical(messages: list[Message]) -> list[Message]:
    return unique_call_ids(_ordered(messages))


def _ordered(messages: list[Message]) -> list[Message]:
    out: list[Message] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        i += 1
        if isinstance(m, UserMessage):
            content = [p for p in m.content if not (isinstance(p, Text) and not p.text)]
            if content:
                out.append(UserMessage(content, attachment=m.attachment))
        elif isinstance(m, AssistantMessage):
            if not m.text and not m.tool_calls:
                continue
            out.append(m)
            if not m.tool_calls:
                continue
            results: dict[str, ToolResult] = {}
            attachments: list[Message] = []
            while i < len(messages):
                n = messages[i]
                if isinstance(n, ToolResult) and n.call_id not in results:
                    results[n.call_id] = n
                elif isinstance(n, UserMessage) and n.attachment:
                    attachments.append(n)
                else:
                    break
                i += 1
            for call in m.tool_calls:
                r = results.pop(call.id, None) or ToolResult(call.id, call.name, _NOT_RUN, True)
                out.append(r if r.text else ToolResult(r.call_id, r.name, _NO_OUTPUT, r.is_error))
            # Results that answer no call of this message cannot be sent as results (every
            # provider refuses an unknown call id); the model still reads them as text.
            out.extend(_orphan(r) for r in results.values())
            out.extend(_ordered(attachments))
        elif isinstance(m, ToolResult):
            out.append(_orphan(m))
        else:
            out.append(m)
    return out


def _orphan(r: ToolResult) -> UserMessage:
    return UserMessage([Text(f"(Result of an earlier {r.name} call, id {r.call_id}:)\n"
                             f"{r.text or _NO_OUTPUT}")], attachment=True)


def _image(ref: ImageRef, images: Images) -> LoadedImage:
    img = images.get(ref)
    return LoadedImage(missing=_NOT_LOADED) if img is None else img


def _b64(img: LoadedImage) -> str:
    return base64.b64encode(img.data).decode("ascii")


def _data_url(img: LoadedImage) -> str:
    return f"data:{img.media_type};base64,{_b64(img)}"


def _parts(parts: list[Text | ImageRef], images: Images, text: Callable[[str], Any],
           image: Callable[[LoadedImage], Any]) -> list[Any]:
    """A user message's parts in a provider's shapes; a picture that could not be read is
    said in text, so the model knows it is gone rather than never having been there."""
    out = []
    for part in parts:
        if isinstance(part, Text):
            out.append(text(part.text))
            continue
        img = _image(part, images)
        out.append(image(img) if img.missing is None
                   else text(missing_image_text(part.path, img.missing)))
    return out


def _merged(turns: list[tuple[str, list[Any]]]) -> list[tuple[str, list[Any]]]:
    """Consecutive turns of one role as one: Anthropic takes strictly alternating roles."""
    out: list[tuple[str, list[Any]]] = []
    for role, parts in turns:
        if out and out[-1][0] == role:
            out[-1][1].extend(parts)
        else:
            out.append((role, list(parts)))
    return out


# Anthropic Messages: system at the top level; tool_use blocks in the assistant's content,
# tool_result blocks first in the next user message; a cache breakpoint after the system prompt
# (tools and system are the stable prefix) and one at the end of the history, which the next
# request of the turn extends.

_EPHEMERAL = {"type": "ephemeral"}


def _anthropic_text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _anthropic_image(img: LoadedImage) -> dict[str, Any]:
    return {"type": "image",
            "source": {"type": "base64", "media_type": img.media_type, "data": _b64(img)}}


def render_anthropic(request: ModelRequest, images: Images) -> dict[str, Any]:
    turns: list[tuple[str, list[Any]]] = []
    for m in _canonical(request.messages):
        if isinstance(m, UserMessage):
            turns.append(("user", _parts(m.content, images, _anthropic_text, _anthropic_image)))
        elif isinstance(m, AssistantMessage):
            blocks: list[Any] = [_anthropic_text(m.text)] if m.text else []
            blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}
                       for c in m.tool_calls]
            turns.append(("assistant", blocks))
        elif isinstance(m, ToolResult):
            block = {"type": "tool_result", "tool_use_id": m.call_id, "content": m.text}
            if m.is_error:
                block["is_error"] = True
            turns.append(("user", [block]))
        elif isinstance(m, Summary):
            turns.append(("user", [_anthropic_text(summary_text(m))]))
    messages = [{"role": role, "content": blocks} for role, blocks in _merged(turns)]
    if messages:
        last = messages[-1]["content"]
        last[-1] = {**last[-1], "cache_control": _EPHEMERAL}
    body: dict[str, Any] = {"max_tokens": request.max_tokens, "messages": messages}
    if request.system:
        body["system"] = [{"type": "text", "text": request.system, "cache_control": _EPHEMERAL}]
    if request.tools:
        body["tools"] = [{"name": t.name, "description": t.description,
                          "input_schema": t.parameters} for t in request.tools]
    return body


# OpenAI chat completions: the system prompt as the first message; tool calls on the assistant
# message with their arguments as a JSON string; one `tool` message per result.

def render_openai_chat(request: ModelRequest, images: Images) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    users: list[Any] = []

    def flush_user() -> None:
        if users:
            messages.append({"role": "user", "content": _chat_content(users)})
            users.clear()

    for m in _canonical(request.messages):
        if isinstance(m, UserMessage):
            users.extend(_parts(m.content, images, _chat_text, _chat_image))
        elif isinstance(m, Summary):
            users.append(_chat_text(summary_text(m)))
        elif isinstance(m, AssistantMessage):
            flush_user()
            msg: dict[str, Any] = {"role": "assistant", "content": m.text or None}
            if m.tool_calls:
                msg["tool_calls"] = [
                    {"id": c.id, "type": "function",
                     "function": {"name": c.name, "arguments": arguments_json(c)}}
                    for c in m.tool_calls]
            messages.append(msg)
        elif isinstance(m, ToolResult):
            flush_user()
            messages.append({"role": "tool", "tool_call_id": m.call_id,
                             "content": _flat_result(m)})
    flush_user()
    body: dict[str, Any] = {"messages": messages, "max_tokens": request.max_tokens}
    if request.tools:
        body["tools"] = [{"type": "function",
                          "function": {"name": t.name, "description": t.description,
                                       "parameters": t.parameters}} for t in request.tools]
    return body


def _chat_text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _chat_image(img: LoadedImage) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": _data_url(img)}}


def _chat_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    # Text alone goes as a plain string: servers for text-only models may not take parts.
    if all(p["type"] == "text" for p in parts):
        return "\n\n".join(p["text"] for p in parts)
    return list(parts)


def _flat_result(r: ToolResult) -> str:
    # Only Anthropic has a flag for a failed call; elsewhere the text says it.
    return f"Error: {r.text}" if r.is_error else r.text
