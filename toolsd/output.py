"""Bounded views of process output: head+tail for one call, a ring and a capped log for
background processes.

Everything here but `CappedLog` is pure (no I/O) and synchronous. Offsets and counts are
bytes of the raw stream; only `render` and `HeadTail.result` turn bytes into text.
"""

from __future__ import annotations

import codecs
import collections
import os
import re
import threading

__all__ = ["CappedLog", "HeadTail", "Ring", "clip", "render"]


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


def _head_piece(data: bytes, budget: int) -> tuple[str, int]:
    """The longest rendered prefix of `data` within `budget` chars, and its byte length.

    A multi-byte sequence cut by the end of `data` is held back (final=False), so the
    prefix never ends in half a character."""
    if budget <= 0 or not data:
        return "", 0
    text = codecs.getincrementaldecoder("utf-8")("surrogateescape").decode(data, final=False)
    # Find the largest k with k + 3 * (escapes in text[:k]) <= budget; an escape is never
    # split, so it is either wholly in or the cut falls just before it.
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
    kept = text[:end]
    return _escape(kept), _byte_len(kept)


def _tail_piece(data: bytes, budget: int, *, at_boundary: bool) -> tuple[str, int]:
    """The longest rendered suffix of `data` (which ends the stream) within `budget` chars,
    and its byte length. Unless `data` starts at a character boundary, up to 3 leading
    continuation bytes (the rest of a character cut off by the start) are skipped."""
    if budget <= 0 or not data:
        return "", 0
    skip = 0
    if not at_boundary:
        while skip < 3 and skip < len(data) and 0x80 <= data[skip] <= 0xBF:
            skip += 1
    text = data[skip:].decode("utf-8", "surrogateescape")
    size = len(text)
    # Mirror of _head_piece: the smallest s with (size - s) + 3 * (escapes in text[s:])
    # <= budget, walking escapes from the end.
    escapes = 0
    start = max(0, size - budget)
    for m in reversed(list(_ESCAPED.finditer(text, start))):
        pos = m.start()
        if size - pos + 3 * escapes + 3 > budget:
            start = max(start, pos + 1)
            break
        escapes += 1
        start = max(0, size - budget + 3 * escapes)
    kept = text[start:]
    return _escape(kept), _byte_len(kept)


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
        head_text, head_bytes = _head_piece(bytes(self._head), room // 2)
        tail_budget = room - len(head_text)
        if contiguous:
            whole = bytes(self._head) + tail
            # The tail may reach back into the head buffer, never into the head piece.
            lo = max(head_bytes, len(whole) - (4 * tail_budget + 6))
            tail_text, tail_bytes = _tail_piece(
                whole[lo:], tail_budget, at_boundary=lo == head_bytes
            )
        else:
            tail_text, tail_bytes = _tail_piece(tail, tail_budget, at_boundary=False)
        left_out = self.total - head_bytes - tail_bytes
        return head_text + template.format(left_out) + tail_text, True


def clip(data: bytes, max_chars: int) -> tuple[str, bool]:
    """`data` rendered within max_chars as HeadTail would: (output, truncated)."""
    buf = HeadTail(max_chars)
    buf.feed(data)
    return buf.result()


def _check_read(since: int, limit: int) -> None:
    if since < 0:
        raise ValueError(f"since must be a byte offset >= 0, got {since}")
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")


class Ring:
    """The recent output of a background process, addressed by absolute byte offsets of the
    whole stream. Keeps at most `capacity` bytes.

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
        # Zero-filled by calloc: pages are only touched as output arrives.
        self._buf = bytearray(capacity)
        self.end = 0

    @property
    def start(self) -> int:
        return max(0, self.end - self.capacity)

    def append(self, data: bytes) -> None:
        n = len(data)
        if not n:
            return
        cap = self.capacity
        if n >= cap:
            self.end += n - cap
            data = data[n - cap :]
            n = cap
        pos = self.end % cap
        first = min(n, cap - pos)
        self._buf[pos : pos + first] = data[:first]
        if first < n:
            self._buf[: n - first] = data[first:]
        self.end += n

    def read(self, since: int, limit: int) -> tuple[bytes, int, int]:
        _check_read(since, limit)
        if since >= self.end:
            return b"", self.end, 0
        start = self.start
        pos = max(since, start)
        n = min(limit, self.end - pos)
        cap = self.capacity
        lo = pos % cap
        first = min(n, cap - lo)
        data = bytes(self._buf[lo : lo + first])
        if first < n:
            data += self._buf[: n - first]
        return data, pos + n, max(0, start - since)


class CappedLog:
    """Append-only log file of a process's output kept within cap bytes: two segments
    (path and path.1) of cap/2 each, rotated; knows the absolute offset of its first kept
    byte so reads by offset work across rotation. File I/O, synchronous (callers use a
    thread or small writes).

    The log starts fresh: an existing `path` is truncated and `path.1` removed; the first
    byte appended has offset `start_offset`. `path` is the newer segment; once it holds
    cap/2 bytes it becomes `path.1` (replacing the older one) and a new `path` begins.
    `read` has the same contract as `Ring.read`. Appends and reads may come from different
    threads (a lock keeps rotation and reads consistent).

    Resource handling: the log owns two file descriptors; `close()` releases them (the
    files stay on disk); append or read after close raise ValueError.
    """

    def __init__(self, path: str, cap: int, *, start_offset: int = 0):
        if cap < 2:
            raise ValueError(f"cap must be >= 2 bytes (two segments), got {cap}")
        if start_offset < 0:
            raise ValueError(f"start_offset must be >= 0, got {start_offset}")
        self.path = path
        self.old_path = path + ".1"
        self._seg = cap // 2
        self._lock = threading.Lock()
        self._cur_start = start_offset
        self._cur_len = 0
        self._old_fd: int | None = None
        self._closed = False
        try:
            os.unlink(self.old_path)
        except FileNotFoundError:
            pass
        self._cur_fd = self._open_segment()

    def _open_segment(self) -> int:
        return os.open(
            self.path,
            os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC,
            0o600,
        )

    @property
    def start(self) -> int:
        return self._cur_start - self._seg if self._old_fd is not None else self._cur_start

    @property
    def end(self) -> int:
        return self._cur_start + self._cur_len

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"log {self.path} is closed")

    def append(self, data: bytes) -> None:
        with self._lock:
            self._check_open()
            seg = self._seg
            view = memoryview(data)
            rotations = (self._cur_len + len(view)) // seg
            if rotations >= 2:
                # Everything before the last full segment would be rotated out again
                # within this call: skip writing it.
                skip = (rotations - 1) * seg - self._cur_len
                self._cur_start += (rotations - 1) * seg
                self._cur_len = 0
                os.ftruncate(self._cur_fd, 0)
                self._drop_old()
                view = view[skip:]
            while len(view):
                piece = view[: seg - self._cur_len]
                _write_all(self._cur_fd, piece)
                self._cur_len += len(piece)
                view = view[len(piece) :]
                if self._cur_len == seg:
                    self._rotate()

    def _drop_old(self) -> None:
        if self._old_fd is not None:
            os.close(self._old_fd)
            self._old_fd = None
            os.unlink(self.old_path)

    def _rotate(self) -> None:
        os.replace(self.path, self.old_path)
        if self._old_fd is not None:
            os.close(self._old_fd)
        self._old_fd = self._cur_fd
        self._cur_fd = self._open_segment()
        self._cur_start += self._seg
        self._cur_len = 0

    def read(self, since: int, limit: int) -> tuple[bytes, int, int]:
        _check_read(since, limit)
        with self._lock:
            self._check_open()
            end, start = self.end, self.start
            if since >= end:
                return b"", end, 0
            pos = max(since, start)
            n = min(limit, end - pos)
            parts = []
            if pos < self._cur_start:
                k = min(n, self._cur_start - pos)
                parts.append(_pread_all(self._old_fd, k, pos - start))
                pos += k
                n -= k
            if n:
                parts.append(_pread_all(self._cur_fd, n, pos - self._cur_start))
                pos += n
            return b"".join(parts), pos, max(0, start - since)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.close(self._cur_fd)
            if self._old_fd is not None:
                os.close(self._old_fd)
                self._old_fd = None

    def __enter__(self) -> CappedLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _write_all(fd: int, data: memoryview) -> None:
    while len(data):
        data = data[os.write(fd, data) :]


def _pread_all(fd: int | None, n: int, offset: int) -> bytes:
    assert fd is not None
    parts = []
    while n:
        chunk = os.pread(fd, n, offset)
        if not chunk:
            # Someone truncated the file behind our back; report what is there.
            break
        parts.append(chunk)
        n -= len(chunk)
        offset += len(chunk)
    return b"".join(parts)
