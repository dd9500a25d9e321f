"""Length-prefixed frames: a 4-byte big-endian length, then that many bytes. No I/O here.

The length is checked against the limit as soon as the 4 header bytes are in, before a single
byte of the body is read or buffered: a peer announcing 2 GiB costs us 4 bytes.
"""

from __future__ import annotations

import struct

_HEADER = struct.Struct(">I")
HEADER_SIZE = _HEADER.size


class FrameTooLarge(Exception):
    def __init__(self, length: int, limit: int):
        super().__init__(f"frame of {length} bytes is over the limit of {limit} bytes")
        self.length = length
        self.limit = limit


def encode_frame(body: bytes, limit: int | None = None) -> bytes:
    if limit is not None and len(body) > limit:
        raise FrameTooLarge(len(body), limit)
    return _HEADER.pack(len(body)) + body


class FrameReader:
    """Accumulates received bytes and hands out whole frame bodies.

    feed() returns every frame completed by the data; a header over the limit raises
    FrameTooLarge at once (the caller answers and closes without reading the body).
    """

    def __init__(self, limit: int):
        self.limit = limit
        self._buf = bytearray()
        self._need: int | None = None  # body length of the frame being read, once known

    def feed(self, data: bytes) -> list[bytes]:
        if not self._buf and self._need is None and len(data) >= HEADER_SIZE:
            # The usual read, one whole frame and nothing before it: no copy into the
            # buffer and out again.
            (length,) = _HEADER.unpack_from(data)
            if length + HEADER_SIZE == len(data) and length <= self.limit:
                return [data[HEADER_SIZE:]]
        self._buf += data
        frames = []
        while True:
            if self._need is None:
                if len(self._buf) < HEADER_SIZE:
                    break
                (length,) = _HEADER.unpack_from(self._buf)
                if length > self.limit:
                    raise FrameTooLarge(length, self.limit)
                del self._buf[:HEADER_SIZE]
                self._need = length
            if len(self._buf) < self._need:
                break
            frames.append(bytes(self._buf[: self._need]))
            del self._buf[: self._need]
            self._need = None
        return frames

    @property
    def pending(self) -> int:
        """Bytes received that do not yet make a whole frame (a cut-off frame at EOF)."""
        return len(self._buf) + (HEADER_SIZE if self._need is not None else 0)
