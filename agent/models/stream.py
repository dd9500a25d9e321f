"""Reading a provider's streamed reply: server-sent events and tool-call arguments. Pure.

Both adapters read the same two things the same way; what servers get wrong about them
(no space after `data:`, no blank line before the end, arguments as an object, as a string,
as a string holding a string) is tolerated here once.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import msgspec

from agent.history.messages import ToolCall


class ServerSentEvent(msgspec.Struct, frozen=True):
    """One server-sent event: `event` is "" when the server named none."""

    event: str
    data: str


class SSEDecoder:
    """Lines in (without their line ending), events out, as the SSE spec reads them: `data`
    lines joined with newlines, a blank line dispatches, `:` starts a comment."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []
        self._partial: list[str] = []  # the line the last text ended in

    def feed_text(self, text: str) -> list[ServerSentEvent]:
        """Text as it arrives, cut anywhere: the events its complete lines end."""
        if "\n" not in text:
            self._partial.append(text)
            return []
        lines = "".join([*self._partial, text]).split("\n")
        tail = lines.pop()
        self._partial = [tail] if tail else []
        return [e for e in map(self.feed, (line.removesuffix("\r") for line in lines))
                if e is not None]

    def feed(self, line: str) -> ServerSentEvent | None:
        """One line, without its line ending."""
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None

    def close(self) -> ServerSentEvent | None:
        """The event a server left without its closing blank line, if any."""
        if self._partial:
            self.feed("".join(self._partial).removesuffix("\r"))
            self._partial = []
        return self._dispatch()

    def _dispatch(self) -> ServerSentEvent | None:
        if not self._data:
            self._event = ""
            return None
        event = ServerSentEvent(self._event, "\n".join(self._data))
        self._event, self._data = "", []
        return event


def new_call_id() -> str:
    """An id for a tool call the server sent without one: results are matched to calls by
    id, so every call needs one, unique in the conversation."""
    return "call_" + uuid.uuid4().hex[:24]


def tool_call(call_id: str, name: str, raw: Any, seen: set[str]) -> ToolCall:
    """One call of a reply as the server sent it: its id (a new one where it is missing or
    already used in the reply; `seen` holds those used), its name, its arguments as sent
    (`parse_arguments`). A call that cannot be run carries the error the model is told."""
    if not call_id or call_id in seen:
        call_id = new_call_id()
    seen.add(call_id)
    arguments, error = parse_arguments(raw)
    if not name:
        error = "the call names no tool; say which tool to call"
    return ToolCall(call_id, name, arguments if error is None else {}, error)


_EXCERPT = 200


def parse_arguments(raw: Any) -> tuple[dict[str, Any], str | None]:
    """A tool call's arguments as the model sent them -> (arguments, error). `error` is said
    to the model instead of running the call, so it tells the model what to send instead."""
    if raw is None or raw == "":
        return {}, None
    value = raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as e:
            return {}, (f"the arguments are not valid JSON ({e.msg} at character {e.pos}): "
                        f"{_excerpt(raw)}; send them as one JSON object")
        if isinstance(value, str):
            # Some models encode the object twice: a JSON string that holds the JSON object.
            try:
                inner = json.loads(value)
            except json.JSONDecodeError:
                inner = None
            if isinstance(inner, dict):
                value = inner
    if not isinstance(value, dict):
        return {}, (f"the arguments must be one JSON object, not {_json_type(value)}: "
                    f"{_excerpt(raw if isinstance(raw, str) else json.dumps(raw))}")
    return value, None


def _excerpt(text: str) -> str:
    return text if len(text) <= _EXCERPT else text[:_EXCERPT] + "..."


def _json_type(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


# A server's JSON is read as data of any shape: where an object, a list or a string belongs
# and something else came, it counts as absent, never as a crash.

def load_json(data: str) -> Any:
    """`data` parsed, or ValueError (also for nesting too deep to parse)."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def as_str(value: Any) -> str:
    return value if isinstance(value, str) else ""
