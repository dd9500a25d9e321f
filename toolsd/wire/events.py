"""Event frames (protocol 1.1 "stream"): what the daemon sends for a request before its reply.

`{"id": <the request's id>, "event": "output", "data": <str>}`, only to a request that asked
with `stream: true`. Pure: shared by the daemon (encoding) and the client (telling an event
from a reply).
"""

from __future__ import annotations

import msgspec

OUTPUT = "output"
# The most text one output event carries, in UTF-8 bytes (and so in characters too).
EVENT_MAX_BYTES = 64 * 1024


class Event(msgspec.Struct):
    """One event of a streaming request: `data` is output rendered as `output` is; a
    file.watch's ("file", protocol 1.2) has `kind`, `path` and, for a move, `to` instead."""

    id: int
    event: str
    data: str = ""
    kind: str | None = None
    path: str | None = None
    to: str | None = None


_encoder = msgspec.msgpack.Encoder()


def encode_event(request_id: int, data: str, event: str = OUTPUT) -> bytes:
    return _encoder.encode(Event(id=request_id, event=event, data=data))
