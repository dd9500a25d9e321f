"""Bounded views of process output: head+tail for one call and a ring for background
processes (their capped log file is capped_log.py's, the `until` search until.py's).

Pure (no I/O) and synchronous. Offsets and counts are bytes of the raw stream; only `render`,
the pieces and `HeadTail.result` turn bytes into text.
"""

from __future__ import annotations

import codecs
import collections
import re


__all__ = ["HeadTail", "Ring", "clip", "event_piece", "head_piece", "render", "tail_piece"]


def render(data: bytes) -> str:
    """Bytes -> str for the wire: UTF-8, invalid bytes shown as \\xNN (backslashreplace),
    so binary garbage comes through visible and the msgpack str stays valid UTF-8."""
    return data.decode("utf-8", "backslashreplace")


# Internally bytes are decoded with surrogateescape: each invalid byte becomes exactly one
# lone surrogate (U+DC80..U+DCFF), so a cut in the decoded text maps back to an exact byte
# count, and each such char is known to render as 4 chars (\xNN).
_ESCAPED = re.compile("[\udc80-\udcff]")
_ESCAPE_WIDTH = 4


def _escape(text: str) -> str:
    if text.isascii():
        return text
    return _ESCAPED.sub(lambda m: "\\x%02x" % (ord(m.group()) - 0xDC00), text)


def _byte_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape"))


# Rendering goes block by block: each block is decoded in one C call (fast when it is valid
# UTF-8), and only the block where the budget runs out is walked escape by escape. So the work
# is linear in what is kept, and no single call holds the interpreter for long (a worker
# thread rendering a big read leaves the event loop its turns).
_BLOCK = 16 << 10


def _is_continuation(byte: int) -> bool:
    return 0x80 <= byte <= 0xBF


def safe_split(data: bytes, pos: int) -> int:
    """The first position at or after `pos` where `data` can be cut so that both sides decode
    as they would together: no valid UTF-8 sequence spans it. At most 3 bytes on: a byte
    with no lead byte among the 3 before it cannot continue a sequence."""
    end = len(data)
    while 0 < pos < end and _is_continuation(data[pos]) and any(
            data[q] >= 0xC0 for q in range(max(0, pos - 3), pos)):
        pos += 1
    return min(pos, end)


def _incomplete_tail(data: bytes) -> int:
    """How many bytes at the end of `data` are the start of a character that more bytes could
    still complete (what an incremental decoder would hold back)."""
    decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")
    decoder.decode(data[-4:], final=False)
    return len(decoder.getstate()[0])


def _prefix_within(text: str, budget: int) -> str:
    """The longest prefix of `text` (decoded with surrogateescape) rendering within `budget`
    chars: the largest k with k + 3 * (escapes in text[:k]) <= budget. An escape is never
    split: it is either wholly in or the cut falls just before it."""
    escapes = 0
    end = None
    for m in _ESCAPED.finditer(text, 0, min(len(text), budget)):
        pos = m.start()
        if pos + 3 * escapes + _ESCAPE_WIDTH > budget:
            end = min(pos, budget - 3 * escapes)
            break
        escapes += 1
    if end is None:
        end = min(len(text), budget - 3 * escapes)
    return text[:max(0, end)]


def _suffix_within(text: str, budget: int) -> str:
    """Mirror of _prefix_within: the longest suffix of `text` rendering within `budget`."""
    size = len(text)
    escapes = 0
    start = max(0, size - budget)
    for m in reversed(list(_ESCAPED.finditer(text, start))):
        pos = m.start()
        if size - pos + 3 * escapes + 3 > budget:
            start = max(start, pos + 1)
            break
        escapes += 1
        start = max(0, size - budget + 3 * escapes)
    return text[start:]


def head_piece(data: bytes, budget: int, *, final: bool = False) -> tuple[str, int]:
    """The longest rendered prefix of `data` within `budget` chars, and its byte length.

    Unless `final` (data ends the stream), a multi-byte sequence cut by the end of `data` is
    held back, so the prefix never ends in half a character. Linear in what is kept."""
    if budget <= 0 or not data:
        return "", 0
    end = len(data) if final else len(data) - _incomplete_tail(data)
    pieces = []
    room = budget
    pos = 0
    while pos < end and room > 0:
        cut = safe_split(data, min(pos + _BLOCK, end)) if pos + _BLOCK < end else end
        block = data[pos:cut]
        text = render(block)
        if len(text) <= room:
            pieces.append(text)
            room -= len(text)
            pos = cut
            continue
        kept = _prefix_within(block.decode("utf-8", "surrogateescape"), room)
        pieces.append(_escape(kept))
        pos += _byte_len(kept)
        break
    return "".join(pieces), pos


def event_piece(data: bytes, limit: int, *, final: bool = False) -> tuple[str, int]:
    """The first piece of `data` for one output event: rendered as `output` is, at most
    `limit` bytes of UTF-8 (and so at most `limit` characters), and its byte length. Unless
    `data` is `final` (it ends the stream), a character cut by its end or by the limit
    waits for the next piece ("", 0 if that is all there is)."""
    end = final and len(data) <= limit
    text, used = head_piece(data[:limit], limit, final=end)
    if not text.isascii() and len(text.encode()) > limit:
        # A character is at most four bytes of UTF-8 (an invalid byte renders as four
        # characters of one byte): a quarter of the limit in characters always fits.
        text, used = head_piece(data[:limit], limit // 4, final=end)
    return text, used


def tail_piece(data: bytes, budget: int, *, at_boundary: bool) -> tuple[str, int]:
    """The longest rendered suffix of `data` (which ends the stream) within `budget` chars,
    and its byte length. Unless `data` starts at a character boundary, up to 3 leading
    continuation bytes (the rest of a character cut off by the start) are skipped."""
    if budget <= 0 or not data:
        return "", 0
    first = 0
    if not at_boundary:
        while first < 3 and first < len(data) and _is_continuation(data[first]):
            first += 1
    pieces = []
    room = budget
    pos = len(data)
    while pos > first and room > 0:
        lo = safe_split(data, pos - _BLOCK) if pos - _BLOCK > first else first
        block = data[lo:pos]
        text = render(block)
        if len(text) <= room:
            pieces.append(text)
            room -= len(text)
            pos = lo
            continue
        kept = _suffix_within(block.decode("utf-8", "surrogateescape"), room)
        pieces.append(_escape(kept))
        pos -= _byte_len(kept)
        break
    pieces.reverse()
    return "".join(pieces), len(data) - pos


_MARKERS = ("\n[... {} bytes left out ...]\n", "[...{} bytes]", "...")


def _marker_template(left_out_max: int, max_chars: int) -> str:
    """The marker form for a budget: the first that takes at most half of it, else the
    first that fits at all, so a small budget still shows some output."""
    for need in (2, 1):
        for form in _MARKERS:
            if need * len(form.format(left_out_max)) <= max_chars:
                return form
    return "..."[:max_chars]


class HeadTail:
    """Bounded head+tail of a stream: keeps the first and the last part, counts everything.
    Memory stays O(max) however much is fed.

    `result()` renders at most `max_chars` characters, marker included. Both parts are kept
    in bytes, 2*max_chars+8 each: a character renders from at most 4 bytes, so that is
    enough for either half, and if bytes had to be dropped the whole could never have fit.
    """

    def __init__(self, max_chars: int):
        if max_chars < 0:
            raise ValueError(f"max_chars must be >= 0, got {max_chars}")
        self.max_chars = max_chars
        self.total = 0
        self._cap = 2 * max_chars + 8 if max_chars else 0
        self._head = bytearray()
        # The tail keeps the caller's chunks by reference (bytes are immutable), so a feed
        # costs O(1) beyond what is dropped; it holds at most cap + one chunk.
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_len = 0

    def feed(self, data: bytes) -> None:
        n = len(data)
        if not n:
            return
        self.total += n
        cap = self._cap
        room = cap - len(self._head)
        if room > 0:
            self._head += data[:room]
            if n <= room:
                return
            data = data[room:]
            n = len(data)
        if n >= cap:
            self._tail.clear()
            self._tail.append(bytes(data[n - cap :]) if cap else b"")
            self._tail_len = cap
            return
        self._tail.append(bytes(data))
        self._tail_len += n
        tail = self._tail
        while self._tail_len - len(tail[0]) >= cap:
            self._tail_len -= len(tail.popleft())

    def result(self) -> tuple[str, bool]:
        """(output, truncated): the whole stream rendered if it fits in max_chars, else the
        head, one marker line saying how many bytes were left out, and the tail."""
        if self.max_chars == 0:
            return "", self.total > 0
        tail = b"".join(self._tail)
        if len(tail) > self._cap:
            tail = tail[-self._cap :]
        contiguous = len(self._head) + len(tail) == self.total
        if contiguous:
            text = render(bytes(self._head) + tail)
            if len(text) <= self.max_chars:
                return text, False
        template = _marker_template(self.total, self.max_chars)
        room = self.max_chars - len(template.format(self.total))
        head_text, head_bytes = head_piece(bytes(self._head), room // 2)
        tail_budget = room - len(head_text)
        if contiguous:
            whole = bytes(self._head) + tail
            # The tail may reach back into the head buffer, never into the head piece.
            lo = max(head_bytes, len(whole) - (4 * tail_budget + 6))
            tail_text, tail_bytes = tail_piece(
                whole[lo:], tail_budget, at_boundary=lo == head_bytes
            )
        else:
            tail_text, tail_bytes = tail_piece(tail, tail_budget, at_boundary=False)
        left_out = self.total - head_bytes - tail_bytes
        return head_text + template.format(left_out) + tail_text, True

    def result_with(self, notice: str) -> tuple[str, bool]:
        """As result(), with the line `notice` (if any, and if it fits) last, all within
        max_chars. Call it once: it spends the notice's room from max_chars."""
        if not notice:
            return self.result()
        budget = self.max_chars - len(notice) - 1
        if budget < 0:
            return self.result()
        self.max_chars = budget  # the bytes kept suffice for any smaller budget
        text, truncated = self.result()
        if text and not text.endswith("\n"):
            text += "\n"  # budget kept room for it
        return text + notice, truncated


def clip(data: bytes, max_chars: int) -> tuple[str, bool]:
    """`data` rendered within max_chars as HeadTail would: (output, truncated)."""
    buf = HeadTail(max_chars)
    buf.feed(data)
    return buf.result()


def check_read(since: int, limit: int) -> None:
    if since < 0:
        raise ValueError(f"since must be a byte offset >= 0, got {since}")
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")


class Ring:
    """The recent output of a background process, addressed by absolute byte offsets of the
    whole stream. Keeps at most `capacity` bytes; memory grows with the output up to that, so
    a process that prints little costs little.

    read(since, limit) -> (data, next, dropped_bytes):
    - data starts at max(since, start), at most `limit` bytes; next = offset after it.
    - dropped_bytes = max(0, start - since): output that was there but is no longer kept.
    - since beyond end (a stale or foreign offset) is clamped: (b"", end, 0), so the caller
      carries on from the real end instead of waiting for an offset that may never come.
    - negative since or limit: ValueError.
    """

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 byte, got {capacity}")
        self.capacity = capacity
        # Offset x lives at index (x - _origin) % len(_buf). While the buffer grows it holds
        # [_origin, end) in order; once it is full it wraps around.
        self._buf = bytearray()
        self._origin = 0
        self.end = 0

    @property
    def start(self) -> int:
        return self.end - len(self._buf)

    def append(self, data: bytes) -> None:
        n = len(data)
        if not n:
            return
        cap = self.capacity
        if n >= cap:
            self._buf = bytearray(memoryview(data)[n - cap:])
            self.end += n
            self._origin = self.end - cap
            return
        view = memoryview(data)
        room = cap - len(self._buf)
        if room:
            take = min(room, n)
            self._buf += view[:take]
            self.end += take
            if take == n:
                return
            view = view[take:]
            n -= take
        pos = (self.end - self._origin) % cap
        first = min(n, cap - pos)
        self._buf[pos : pos + first] = view[:first]
        if first < n:
            self._buf[: n - first] = view[first:]
        self.end += n

    def read(self, since: int, limit: int) -> tuple[bytes, int, int]:
        check_read(since, limit)
        if since >= self.end:
            return b"", self.end, 0
        start = self.start
        pos = max(since, start)
        n = min(limit, self.end - pos)
        if n == 0:
            return b"", pos, max(0, start - since)
        size = len(self._buf)
        lo = (pos - self._origin) % size
        first = min(n, size - lo)
        data = bytes(self._buf[lo : lo + first])
        if first < n:
            data += self._buf[: n - first]
        return data, pos + n, max(0, start - since)

    def shrink(self, capacity: int) -> None:
        """Keep only the last `capacity` bytes from now on, and release the rest."""
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 byte, got {capacity}")
        if capacity >= self.capacity:
            return
        lo = max(self.start, self.end - capacity)
        kept, _next, _dropped = self.read(lo, self.end - lo) if self.end > lo else (b"", 0, 0)
        self._buf = bytearray(kept)
        self._origin = lo
        self.capacity = capacity
