"""Bounded views of process output: head+tail for one call, a ring and a capped log for
background processes, and the windowed `until` search over a process's new output.

Everything here but `CappedLog` is pure (no I/O) and synchronous. Offsets and counts are
bytes of the raw stream; only `render`, the pieces and `HeadTail.result` turn bytes into
text.
"""

from __future__ import annotations

import codecs
import collections
import os
import re
import threading

import re2

__all__ = ["CappedLog", "HeadTail", "Ring", "UntilPattern", "UntilScan", "clip",
           "compile_until", "head_piece", "render", "tail_piece"]


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


def _safe_split(data: bytes, pos: int) -> int:
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
        cut = _safe_split(data, min(pos + _BLOCK, end)) if pos + _BLOCK < end else end
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
        lo = _safe_split(data, pos - _BLOCK) if pos - _BLOCK > first else first
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


def _check_read(since: int, limit: int) -> None:
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
        _check_read(since, limit)
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

    Resource handling: the log owns two file descriptors while it is written. `seal()` ends
    the writing and releases them: the files stay and reads open them for their own
    duration, so a finished process's log costs disk but no descriptor. `close()` releases
    them too (the files stay on disk); append or read after close raise ValueError, append
    after seal too.
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
        self._has_old = False
        self._closed = False
        self._sealed = False
        try:
            os.unlink(self.old_path)
        except FileNotFoundError:
            pass
        self._cur_fd: int | None = self._open_segment()

    def _open_segment(self) -> int:
        return os.open(
            self.path,
            os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC,
            0o600,
        )

    @property
    def start(self) -> int:
        return self._cur_start - self._seg if self._has_old else self._cur_start

    @property
    def end(self) -> int:
        return self._cur_start + self._cur_len

    @property
    def kept(self) -> int:
        """Bytes of output the log holds (its size on disk)."""
        return self.end - self.start

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"log {self.path} is closed")

    def append(self, data: bytes) -> None:
        with self._lock:
            self._check_open()
            if self._sealed:
                raise ValueError(f"log {self.path} is sealed: its stream has ended")
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
            self._has_old = False
            os.unlink(self.old_path)

    def _rotate(self) -> None:
        os.replace(self.path, self.old_path)
        if self._old_fd is not None:
            os.close(self._old_fd)
        self._old_fd = self._cur_fd
        self._has_old = True
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
                parts.append(self._pread(self._old_fd, self.old_path, k, pos - start))
                pos += k
                n -= k
            if n:
                parts.append(self._pread(self._cur_fd, self.path, n, pos - self._cur_start))
                pos += n
            return b"".join(parts), pos, max(0, start - since)

    def _pread(self, fd: int | None, path: str, n: int, offset: int) -> bytes:
        if not self._sealed:
            return _pread_all(fd, n, offset)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return _pread_all(fd, n, offset)
        finally:
            os.close(fd)

    def seal(self) -> None:
        """The stream has ended: release the file descriptors, keep the files readable."""
        with self._lock:
            if self._closed or self._sealed:
                return
            self._sealed = True
            self._release_fds()

    def _release_fds(self) -> None:
        if self._cur_fd is not None:
            os.close(self._cur_fd)
            self._cur_fd = None
        if self._old_fd is not None:
            os.close(self._old_fd)
            self._old_fd = None

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._release_fds()

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


# ---------------------------------------------------------------- until

# `until` patterns come from clients and are matched against output a sandboxed program
# chose: RE2 matches in time linear in the text (no backtracking), so no pattern can stall
# the daemon the way `(a+)+$` stalls Python's `re`.
def _re2_options(max_mem: int):
    options = re2.Options()
    options.log_errors = False  # errors are reported to the client, not to our stderr
    options.max_mem = max_mem
    return options


# Compiling holds the interpreter for as long as it takes (a third of a second for \pL{300}):
# a probe with little memory refuses a huge program within milliseconds, and only a pattern
# that passes is compiled for searching, with room for RE2's DFA cache (each search's own:
# nothing is cached across requests, so hostile patterns cannot pile up memory).
_PROBE_OPTIONS = _re2_options(256 << 10)
_SEARCH_OPTIONS = _re2_options(2 << 20)
MAX_UNTIL_CHARS = 10_000
# RE2's cost per byte grows with the compiled program (a Unicode class like \pL alone is
# ~1,200 instructions): past this, a pattern is refused rather than searched slowly.
MAX_UNTIL_PROGRAM = 5000
# How far back into output already searched a later search looks again, so that a match
# split across two pieces of output is still found: any match spanning at most this many
# bytes is found, whatever the pieces.
UNTIL_OVERLAP_BYTES = 4 << 10
# New output is searched at most this much at a time (one bounded step each).
UNTIL_PIECE_BYTES = 64 << 10

_UNSUPPORTED = (
    # (start of RE2's complaint, what the user wrote, in words)
    ("invalid perl operator: (?=", "a lookahead (?=...)"),
    ("invalid perl operator: (?!", "a negative lookahead (?!...)"),
    ("invalid perl operator: (?<=", "a lookbehind (?<=...)"),
    ("invalid perl operator: (?<!", "a negative lookbehind (?<!...)"),
    ("invalid perl operator: (?>", "an atomic group (?>...)"),
    ("invalid perl operator: (?(", "a conditional group (?(...)...)"),
    ("invalid perl operator: (?#", "a comment group (?#...)"),
    ("invalid perl operator: (?x", "verbose mode (?x)"),
    ("bad repetition operator: *+", "a possessive quantifier (*+)"),
    ("bad repetition operator: ++", "a possessive quantifier (++)"),
    ("bad repetition operator: ?+", "a possessive quantifier (?+)"),
    ("bad repetition operator: }+", "a possessive quantifier ({n}+)"),
    ("invalid escape sequence: \\Z", "\\Z (write \\z for the end of the output)"),
    ("invalid escape sequence: \\N", "a named character \\N{...}"),
    ("invalid repetition size", "a repetition count over 1000"),
)


def _unsupported(complaint: str, pattern: str) -> str:
    m = re.match(r"invalid escape sequence: \\(\d)", complaint)
    if m:
        return f"a backreference (\\{m.group(1)})"
    if complaint.startswith("invalid perl operator: (?P") and "(?P=" in pattern:
        return "a named backreference (?P=name)"
    for prefix, words in _UNSUPPORTED:
        if complaint.startswith(prefix):
            return words
    if complaint.startswith("invalid perl operator: "):
        return f"the construct {complaint.removeprefix('invalid perl operator: ')}"
    return f"something RE2 refuses ({complaint})"


class UntilPattern:
    """A compiled `until` pattern (see compile_until). `search` is pure and may run in a
    worker thread: RE2 releases the interpreter while it matches."""

    def __init__(self, regexp, program_size: int):
        self._regexp = regexp
        self.program_size = program_size

    def work(self, nbytes: int) -> int:
        """A bound on the cost of searching `nbytes` of output, in abstract steps (rendering
        costs about as much per byte as a small program)."""
        return nbytes * (self.program_size + 16)

    def search(self, data: bytes, context: str = "") -> bool:
        """Whether `data` (rendered as `output` shows it) contains a match. `context` is the
        character before `data`, or "" where `data` starts the text: `^`, `\\A` and `\\b`
        look at it without a match ever including it."""
        text = context + render(data)
        return self._regexp.search(text, len(context)) is not None


def compile_until(pattern: str) -> UntilPattern:
    """`pattern` compiled for matching in linear time, in multi-line mode (`^` and `$` match
    at every line start and end). Python's `re` syntax as far as RE2 shares it.
    ValueError says what is wrong and what to do."""
    if len(pattern) > MAX_UNTIL_CHARS:
        raise ValueError(f"until is {len(pattern)} characters long, at most "
                         f"{MAX_UNTIL_CHARS}; give a shorter pattern")
    source = "(?m)" + pattern
    try:
        # _Regexp, not re2.compile: the module's cache would keep up to 128 patterns (and
        # their DFA caches) alive.
        probe = re2._Regexp(source, _PROBE_OPTIONS)
    except re2.error as e:
        complaint = e.args[0].decode(errors="replace") if e.args and isinstance(
            e.args[0], bytes) else str(e)
        if complaint.startswith("pattern too large"):
            raise ValueError(_too_complex(None)) from None
        try:
            re.compile(pattern)
        except (re.error, RecursionError, OverflowError) as bad:
            raise ValueError(f"until is not a valid regular expression ({bad}); fix the "
                             f"pattern") from None
        raise ValueError(
            f"until uses {_unsupported(complaint, pattern)}, which toolsd does not support: "
            f"`until` is matched in linear time (RE2 syntax), without backreferences, "
            f"lookaround, atomic groups or possessive quantifiers; rewrite the pattern "
            f"without it") from None
    size = probe._regexp.ProgramSize()
    if size > MAX_UNTIL_PROGRAM:
        raise ValueError(_too_complex(size))
    return UntilPattern(re2._Regexp(source, _SEARCH_OPTIONS), size)


def _too_complex(size: int | None) -> str:
    how = (f"{size} RE2 instructions" if size is not None else "far more RE2 instructions")
    return (f"until is too complex to search quickly ({how}, at most {MAX_UNTIL_PROGRAM}); "
            f"simplify it: smaller repetition counts, fewer Unicode classes like \\pL")


class UntilScan:
    """Which output an `until` search looks at next, so that the total searched stays
    linear in the output: each step takes at most `piece` bytes of output not searched yet,
    plus the `overlap` bytes before them (already searched, but a match may straddle the
    seam). Output from `start` (the read's start) on is the text: `^` matches there.

    Only output still in the ring is searched; what fell out of it unseen is skipped.
    """

    def __init__(self, start: int, *, overlap: int = UNTIL_OVERLAP_BYTES,
                 piece: int = UNTIL_PIECE_BYTES):
        self.start = start
        self.scanned = start  # the search found nothing in [start, scanned)
        self.overlap = overlap
        self.piece = piece

    def next_window(self, ring: Ring) -> tuple[bytes, str] | None:
        """(bytes to search, the character before them) for the next step, or None when
        all of `ring` has been searched. Moves on: the caller searches what it got."""
        base = max(self.start, ring.start)
        scanned = max(self.scanned, base)
        if ring.end <= scanned:
            return None
        end = min(ring.end, scanned + self.piece)
        lo = max(base, scanned - self.overlap)
        # A few bytes more in front: the character before the window is its context.
        pre = max(base, lo - 4)
        data, _next, _dropped = ring.read(pre, end - pre)
        if lo > base:
            lo = pre + _safe_split(data, lo - pre)
        self.scanned = end
        head, window = data[: lo - pre], data[lo - pre :]
        return window, render(head)[-1:]
