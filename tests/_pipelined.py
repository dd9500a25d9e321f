"""Requests written to a daemon's socket in one write, as a client that pipelines them would,
and the replies in the order they came back; framed by the wire's own toolsd.wire.framing."""

from __future__ import annotations

import socket

import msgspec

from toolsd.wire.framing import FrameReader, encode_frame

REPLY_LIMIT = 1 << 30


def frame(request_id: int, method: str, **params) -> bytes:
    return encode_frame(msgspec.msgpack.encode(
        {"id": request_id, "method": method, "params": params}))


def pipelined(daemon, *frames: bytes) -> list[dict]:
    """The replies to `frames`, sent in one write, in the order they came back."""
    reader = FrameReader(REPLY_LIMIT)
    replies: list[dict] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(daemon.socket)
        s.sendall(b"".join(frames))
        while len(replies) < len(frames):
            data = s.recv(1 << 16)
            if not data:
                raise AssertionError(f"the daemon closed the connection after "
                                     f"{len(replies)} of {len(frames)} replies")
            replies += [msgspec.msgpack.decode(body) for body in reader.feed(data)]
    return replies
