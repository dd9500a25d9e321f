"""Host side of the REPL framing: split a driver's output into user output and sentinels.

A driver ends request N by writing ``\\x1eTOOLSD-<uuid>:<N>:<json status>\\n`` to its output
pipe, right after whatever the user's code printed (no newline is added before it). This
module finds that line in the byte stream. It is pure: bytes in, bytes and sentinels out.

Why so strict: printed text, a stale sentinel or a forged one must never end a request early
or shift the answers of later calls. Only the sentinel of the request in flight ends it;
everything that merely looks like a sentinel stays user output, byte for byte.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import msgspec

MARKER_PREFIX = b"\x1eTOOLSD-"

# After "<prefix><uuid>:" comes "<seq>:<json object>\n". The drivers write
# {"status": "...", "images": [...]} with ASCII-only JSON, a few KiB at most (the Python
# driver keeps it within 4000 bytes), so a real tail never holds \x1e or \n; bounding it lets a
# forged marker followed by megabytes without a newline be released as output instead of
# being held back forever.
_MAX_TAIL = 4096
_FULL_TAIL = re.compile(rb"(\d{1,18}):(\{[^\n\x1e]*\})\n")
_PARTIAL_TAIL = re.compile(rb"\d{0,18}\Z|\d{1,18}:\Z|\d{1,18}:\{[^\n\x1e]*\Z")


@dataclass
class Sentinel:
    """The end of request `seq`, with the driver's status (e.g. ``{"status": "ok"}``)."""

    seq: int
    status: dict

    @property
    def ok(self) -> bool:
        """The code ran to its end without an error."""
        return self.status.get("status") == "ok"


def format_sentinel(uuid: str, seq: int, status: str) -> bytes:
    """The exact bytes a driver writes after request `seq` (used by tests and fakes)."""
    body = msgspec.json.encode({"status": status})
    return MARKER_PREFIX + uuid.encode() + b":" + str(seq).encode() + b":" + body + b"\n"


class SentinelScanner:
    """Splits a driver's output byte stream into user output and sentinels.

    Only the sentinel for `expect` (the request in flight) ends a request; a stale sentinel
    (lower seq, or the one already returned) is dropped from the output; anything else that
    looks like a sentinel (wrong uuid, a seq not yet sent, garbage after the marker, partial)
    is user output, passed through intact.

    Work is linear in the input: each feed searches only the new bytes plus a held-back tail
    shorter than the marker (or one bounded candidate sentinel line).
    """

    def __init__(self, uuid: str):
        self._marker = MARKER_PREFIX + uuid.encode("ascii") + b":"
        self._pending = b""
        self._expect = 0
        self._in_flight = False

    def expect(self, seq: int) -> None:
        """Request `seq` was sent: its sentinel, and only its, ends it."""
        self._expect = seq
        self._in_flight = True

    def feed(self, data: bytes) -> tuple[bytes, Sentinel | None]:
        """Take more of the stream.

        Returns the output that is safe to emit now (a possible partial marker at the end is
        held back) and the sentinel of the request in flight if it completed. Bytes after
        that sentinel are kept and come out of later calls (``feed(b"")`` releases them).
        """
        buf = self._pending + data if self._pending else bytes(data)
        out: list[bytes] = []
        pos = 0
        marker = self._marker
        while True:
            i = buf.find(marker, pos)
            if i < 0:
                keep = _partial_prefix_start(buf, max(pos, len(buf) - len(marker) + 1), marker)
                out.append(buf[pos:keep])
                self._pending = buf[keep:]
                return b"".join(out), None
            out.append(buf[pos:i])
            tail_start = i + len(marker)
            parsed = _parse_tail(buf, tail_start)
            if parsed is None:
                # Could still become a real sentinel: wait for more bytes.
                self._pending = buf[i:]
                return b"".join(out), None
            if parsed is False:
                # Not a sentinel after all: the marker is user output. Resume right after it
                # (a marker cannot overlap itself: \x1e occurs only at its start).
                out.append(buf[i:tail_start])
                pos = tail_start
                continue
            seq, status, end = parsed
            if self._in_flight and seq == self._expect:
                self._in_flight = False
                self._pending = buf[end:]
                return b"".join(out), Sentinel(seq, status)
            if seq < self._expect or (seq == self._expect and not self._in_flight):
                pos = end  # stale: a request that already ended
                continue
            out.append(buf[i:end])  # a seq never sent: forged, so it is output
            pos = end

    @property
    def holding(self) -> bool:
        """Bytes are held back: `feed(b"")` may release some (or find a sentinel)."""
        return bool(self._pending)

    def flush(self) -> bytes:
        """On end of stream: everything still held back, as output."""
        rest, self._pending = self._pending, b""
        return rest


_decode_json = msgspec.json.Decoder().decode

def _partial_prefix_start(buf: bytes, start: int, marker: bytes) -> int:
    """Where the longest suffix of buf that is a proper prefix of marker begins (len if none).

    Only the last len(marker)-1 bytes can hold one, and it must start with \\x1e.
    """
    j = buf.find(b"\x1e", start)
    while j >= 0:
        if marker.startswith(buf[j:]):
            return j
        j = buf.find(b"\x1e", j + 1)
    return len(buf)


def _parse_tail(buf: bytes, start: int):
    """Parse "<seq>:<json>\\n" at buf[start:].

    Returns (seq, status, end) for a well-formed sentinel, None when the bytes so far could
    still become one, False when they cannot.
    """
    window = buf[start : start + _MAX_TAIL]
    m = _FULL_TAIL.match(window)
    if m:
        try:
            status = _decode_json(m.group(2))
        except (msgspec.DecodeError, RecursionError):
            return False
        if not isinstance(status, dict) or not isinstance(status.get("status"), str):
            return False
        return int(m.group(1)), status, start + m.end()
    if len(window) < _MAX_TAIL and _PARTIAL_TAIL.match(window):
        return None
    return False
