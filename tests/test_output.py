import codecs
import os
import re
import threading
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import toolsd.tools.output as output
from toolsd.tools.capped_log import CappedLog
from toolsd.tools.output import (
    HeadTail,
    Ring,
    clip,
    event_piece,
    head_piece,
    render,
    tail_piece,
)
from toolsd.tools.until import UNTIL_OVERLAP_BYTES, UntilScan, compile_until

MARKER = re.compile(r"\n\[\.\.\. (\d+) bytes left out \.\.\.\]\n")


def split_marker(text: str) -> tuple[str, int, str]:
    [m] = list(MARKER.finditer(text))
    return text[: m.start()], int(m.group(1)), text[m.end() :]


# --- render -------------------------------------------------------------------------


def test_render_shows_invalid_bytes_as_escapes_and_stays_valid_utf8():
    text = render("naïve ✓ ".encode() + b"\xff\x00\xc3")
    assert text == "naïve ✓ \\xff\x00\\xc3"
    text.encode("utf-8")  # would raise on a lone surrogate


# --- HeadTail -----------------------------------------------------------------------


def test_output_that_fits_comes_back_whole():
    buf = HeadTail(100)
    buf.feed(b"hello ")
    buf.feed("wörld\n".encode())
    assert buf.result() == ("hello wörld\n", False)
    assert buf.total == len("hello wörld\n".encode())


def test_output_of_exactly_max_chars_is_not_truncated_one_more_is():
    assert clip(b"x" * 50, 50) == ("x" * 50, False)
    text, truncated = clip(b"x" * 51, 50)
    assert truncated and len(text) <= 50


def test_long_output_keeps_head_and_tail_and_counts_what_was_left_out():
    data = b"".join(b"line %06d\n" % i for i in range(100_000))
    buf = HeadTail(1000)
    for i in range(0, len(data), 4096):
        buf.feed(data[i : i + 4096])
    text, truncated = buf.result()
    assert truncated and len(text) <= 1000
    head, left_out, tail = split_marker(text)
    assert data.startswith(head.encode())
    assert data.endswith(tail.encode())
    assert len(head) >= 400 and len(tail) >= 400
    assert len(head) + left_out + len(tail) == len(data) == buf.total


def test_seams_never_cut_a_multibyte_character():
    data = "€😀".encode() * 10_000
    for max_chars in (100, 101, 102, 103, 1000):
        text, truncated = clip(data, max_chars)
        assert truncated and len(text) <= max_chars
        assert "\\x" not in text
        head, left_out, tail = split_marker(text)
        assert len(head.encode()) + left_out + len(tail.encode()) == len(data)


def test_binary_garbage_comes_through_escaped_within_budget():
    data = bytes(range(256)) * 400
    text, truncated = clip(data, 500)
    assert truncated and len(text) <= 500
    assert "\\xff" in text
    text.encode("utf-8")


def test_tiny_budgets_still_show_something_sane():
    data = b"abcdefghijklmnopqrstuvwxyz" * 1000
    assert clip(data, 0) == ("", True)
    assert clip(b"", 0) == ("", False)
    for max_chars in range(1, 40):
        text, truncated = clip(data, max_chars)
        assert truncated and 0 < len(text) <= max_chars
        assert "." in text
    text, _ = clip(data, 10)
    assert text.startswith("abc") and text.endswith("xyz")


def test_memory_stays_bounded_however_much_is_fed():
    buf = HeadTail(1000)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(400):  # 26 MB in distinct chunks
            buf.feed(os.urandom(64 * 1024))
        kept = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert buf.total == 400 * 64 * 1024
    # cap (2*1000+8 bytes) per side plus at most one chunk held by reference.
    assert kept < 200 * 1024
    assert len(buf.result()[0]) <= 1000


def test_one_huge_chunk_keeps_only_its_tail():
    data = b"a" * 1000 + b"b" * 5_000_000 + b"z" * 1000
    text, truncated = clip(data, 200)
    head, left_out, tail = split_marker(text)
    assert set(head) == {"a"} and set(tail) == {"z"}
    assert len(head) + left_out + len(tail) == len(data)


@settings(max_examples=300, deadline=None)
@given(
    chunks=st.lists(
        st.one_of(st.binary(max_size=40), st.text(max_size=30).map(str.encode)), max_size=12
    ),
    max_chars=st.integers(min_value=0, max_value=120),
)
def test_head_tail_is_within_budget_and_faithful(chunks, max_chars):
    buf = HeadTail(max_chars)
    for chunk in chunks:
        buf.feed(chunk)
    data = b"".join(chunks)
    whole = render(data)
    text, truncated = buf.result()
    assert len(text) <= max_chars
    assert buf.total == len(data)
    text.encode("utf-8")
    if len(whole) <= max_chars:
        assert (text, truncated) == (whole, False)
        return
    assert truncated
    if MARKER.search(text):
        head, left_out, tail = split_marker(text)
        assert whole.startswith(head) and whole.endswith(tail)
        assert 0 < left_out <= len(data)


@settings(max_examples=300, deadline=None)
@given(
    chunks=st.lists(
        st.one_of(st.binary(max_size=40), st.text(max_size=30).map(str.encode)), max_size=12
    ),
    limit=st.integers(min_value=16, max_value=64),
)
def test_event_pieces_are_bounded_and_join_to_the_rendered_stream(chunks, limit):
    """As a live stream cuts it (tools/live_output.py): whatever the arrivals, each piece is at most
    `limit` bytes of UTF-8, no character is split, and the pieces are `render` of it all."""
    pending, pieces = b"", []
    for n, chunk in enumerate(chunks):
        pending += chunk
        final = n == len(chunks) - 1
        while pending:
            text, used = event_piece(pending, limit, final=final)
            assert len(text.encode()) <= limit
            if not used:
                assert not final and len(pending) < 4  # part of one character
                break
            pieces.append(text)
            pending = pending[used:]
    assert "".join(pieces) == render(b"".join(chunks))


# --- Ring ---------------------------------------------------------------------------


def test_ring_reads_by_absolute_offset_across_wraparound():
    ring = Ring(10)
    ring.append(b"0123456789")
    ring.append(b"abcd")
    assert (ring.start, ring.end) == (4, 14)
    assert ring.read(4, 100) == (b"456789abcd", 14, 0)
    assert ring.read(8, 3) == (b"89a", 11, 0)
    assert ring.read(11, 100) == (b"bcd", 14, 0)


def test_ring_reports_dropped_bytes_for_an_old_offset():
    ring = Ring(8)
    ring.append(b"x" * 20)
    data, nxt, dropped = ring.read(5, 100)
    assert (data, nxt, dropped) == (b"x" * 8, 20, 7)


def test_ring_offset_beyond_end_is_clamped_and_negative_refused():
    ring = Ring(8)
    ring.append(b"abc")
    assert ring.read(3, 10) == (b"", 3, 0)
    assert ring.read(1000, 10) == (b"", 3, 0)
    with pytest.raises(ValueError, match="since"):
        ring.read(-1, 10)
    with pytest.raises(ValueError, match="limit"):
        ring.read(0, -1)
    with pytest.raises(ValueError, match="capacity"):
        Ring(0)


def test_ring_append_larger_than_capacity_keeps_the_last_bytes():
    ring = Ring(4)
    ring.append(b"ab")
    ring.append(b"cdefghij")
    assert ring.read(0, 100) == (b"ghij", 10, 6)


@settings(max_examples=300, deadline=None)
@given(
    capacity=st.integers(min_value=1, max_value=20),
    ops=st.lists(
        st.one_of(
            st.binary(min_size=0, max_size=30).map(lambda b: ("append", b)),
            st.tuples(
                st.just("read"), st.integers(min_value=0, max_value=200), st.integers(0, 40)
            ),
            st.tuples(st.just("shrink"), st.integers(min_value=1, max_value=25)),
        ),
        max_size=30,
    ),
)
def test_ring_matches_a_full_copy_of_the_stream(capacity, ops):
    ring = Ring(capacity)
    stream = b""
    start = 0  # the oldest byte the ring should still have
    for op in ops:
        if op[0] == "append":
            ring.append(op[1])
            stream += op[1]
            start = max(start, len(stream) - capacity)
            continue
        if op[0] == "shrink":
            ring.shrink(op[1])
            capacity = min(capacity, op[1])
            start = max(start, len(stream) - capacity)
            assert (ring.start, ring.end) == (start, len(stream))
            continue
        _, since, limit = op
        if since >= len(stream):
            assert ring.read(since, limit) == (b"", len(stream), 0)
            continue
        pos = max(since, start)
        want = stream[pos : pos + limit]
        assert ring.read(since, limit) == (want, pos + len(want), max(0, start - since))


def test_ring_memory_grows_with_output_not_with_capacity():
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        rings = [Ring(1 << 20) for _ in range(100)]
        for ring in rings:
            ring.append(b"exited quietly\n")
        kept = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert kept < 200 * 1024  # not 100 MiB
    assert rings[0].read(0, 100) == (b"exited quietly\n", 15, 0)


def test_ring_shrink_keeps_the_tail_and_releases_the_rest():
    ring = Ring(1 << 20)
    stream = bytes(range(256)) * 4096  # 1 MiB: the ring is full
    ring.append(stream)
    tracemalloc.start()
    try:
        ring.shrink(1000)
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert after < 10_000
    assert (ring.start, ring.end) == (len(stream) - 1000, len(stream))
    assert ring.read(0, 10) == (stream[-1000:-990], len(stream) - 990, len(stream) - 1000)
    ring.append(b"more")
    assert ring.read(0, 5000)[0] == (stream + b"more")[-1000:]


# --- CappedLog ----------------------------------------------------------------------


def test_log_rotates_into_two_segments_within_cap(tmp_path):
    path = str(tmp_path / "bg1.log")
    with CappedLog(path, 100) as log:
        stream = bytes(range(256)) * 2
        for i in range(0, len(stream), 7):
            log.append(stream[i : i + 7])
            size = os.path.getsize(path) + (
                os.path.getsize(path + ".1") if os.path.exists(path + ".1") else 0
            )
            assert size <= 100
        assert log.end == len(stream)
        assert log.start == len(stream) - len(stream) % 50 - 50
        assert log.read(log.start, 1000) == (stream[log.start :], len(stream), 0)
        # Reading from offset 0 skips what rotated away and says how much.
        data, nxt, dropped = log.read(0, 30)
        want = stream[log.start : log.start + 30]
        assert (data, nxt, dropped) == (want, log.start + 30, log.start)


def test_log_start_offset_continues_a_stream(tmp_path):
    with CappedLog(str(tmp_path / "log"), 10, start_offset=1000) as log:
        assert (log.start, log.end) == (1000, 1000)
        log.append(b"abcdefg")
        assert log.read(1003, 100) == (b"defg", 1007, 0)
        assert log.read(0, 2) == (b"ab", 1002, 1000)
        assert log.read(5000, 2) == (b"", 1007, 0)


def test_log_huge_append_writes_only_what_it_keeps(tmp_path):
    path = str(tmp_path / "log")
    with CappedLog(path, 1000) as log:
        log.append(b"a" * 123)
        stream = b"a" * 123 + bytes(range(256)) * 40_000
        log.append(stream[123:])
        assert log.end == len(stream)
        assert log.end - log.start <= 1000
        data, nxt, _ = log.read(log.start, 10_000)
        assert data == stream[log.start :] and nxt == len(stream)
        with open(path + ".1", "rb") as f:
            assert f.read() == stream[log.start : log.start + 500]


def test_log_starts_fresh_over_old_files_and_refuses_use_after_close(tmp_path):
    path = str(tmp_path / "log")
    for name in (path, path + ".1"):
        with open(name, "wb") as f:
            f.write(b"stale")
    log = CappedLog(path, 100)
    assert not os.path.exists(path + ".1")
    log.append(b"new")
    assert log.read(0, 100) == (b"new", 3, 0)
    log.close()
    log.close()
    with open(path, "rb") as f:
        assert f.read() == b"new"
    with pytest.raises(ValueError, match="closed"):
        log.read(0, 1)
    with pytest.raises(ValueError, match="closed"):
        log.append(b"x")
    with pytest.raises(ValueError, match="cap"):
        CappedLog(path, 1)


def open_fds() -> set[str]:
    return {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")}


def test_sealed_log_holds_no_descriptor_and_stays_readable(tmp_path):
    path = str(tmp_path / "bg7.log")
    stream = bytes(range(256)) * 100
    log = CappedLog(path, 10_000)
    log.append(stream)
    assert path in open_fds() and path + ".1" in open_fds()
    log.seal()
    assert path not in open_fds() and path + ".1" not in open_fds()
    start = len(stream) - 5000 - len(stream) % 5000
    assert (log.start, log.end, log.kept) == (start, len(stream), len(stream) - start)
    assert log.read(0, 100) == (stream[start : start + 100], start + 100, start)
    assert log.read(start + 4990, 20)[0] == stream[start + 4990 : start + 5010]  # both files
    assert path not in open_fds()
    with pytest.raises(ValueError, match="sealed"):
        log.append(b"x")
    log.seal()
    log.close()
    with pytest.raises(ValueError, match="closed"):
        log.read(0, 1)


@settings(max_examples=60, deadline=None)
@given(
    cap=st.integers(min_value=2, max_value=40),
    ops=st.lists(
        st.one_of(
            st.binary(max_size=60).map(lambda b: ("append", b)),
            st.tuples(st.just("read"), st.integers(0, 300), st.integers(0, 50)),
        ),
        max_size=25,
    ),
)
def test_log_matches_a_full_copy_of_the_stream(tmp_path_factory, cap, ops):
    path = str(tmp_path_factory.mktemp("log") / "p.log")
    stream = b""
    with CappedLog(path, cap) as log:
        for op in ops:
            if op[0] == "append":
                log.append(op[1])
                stream += op[1]
                assert log.end == len(stream)
                assert len(stream) - log.start <= 2 * (cap // 2) - 1
                continue
            _, since, limit = op
            data, nxt, dropped = log.read(since, limit)
            if since >= len(stream):
                assert (data, nxt, dropped) == (b"", len(stream), 0)
                continue
            pos = max(since, log.start)
            assert data == stream[pos : pos + limit]
            assert (nxt, dropped) == (pos + len(data), max(0, log.start - since))


def test_log_reads_stay_consistent_while_another_thread_appends(tmp_path):
    # Byte i of the stream is i % 251, so any read can be checked against its offset.
    pattern = bytes(range(251)) * 20

    def expected(pos: int, n: int) -> bytes:
        return pattern[pos % 251 : pos % 251 + n]

    log = CappedLog(str(tmp_path / "log"), 4096)
    total = 400_000
    done = threading.Event()

    def writer():
        pos = 0
        while pos < total:
            n = min(997, total - pos)
            log.append(expected(pos, n))
            pos += n
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    reads = 0
    try:
        while not done.is_set() or reads == 0:
            since = max(0, log.end - 3000)
            data, nxt, dropped = log.read(since, 2500)
            assert data == expected(nxt - len(data), len(data))
            assert nxt - len(data) == since + dropped
            reads += 1
    finally:
        thread.join()
        log.close()
    assert log.end == total


# --- head and tail pieces -----------------------------------------------------------

PIECE_BYTES = st.lists(
    st.sampled_from([b"a", b"\n", b"\\x41", "€".encode(), "😀".encode(), b"\xff", b"\x80",
                     b"\xc3", b"\xe2\x82", b"\xed\xb2\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80"]),
    max_size=40).map(b"".join)


@settings(max_examples=500, deadline=None)
@given(data=PIECE_BYTES, budget=st.integers(0, 130), at_boundary=st.booleans(),
       final=st.booleans())
def test_pieces_are_the_longest_that_fit_whatever_the_block_seams(data, budget, at_boundary,
                                                                   final):
    whole = (head_piece(data, budget, final=final),
             tail_piece(data, budget, at_boundary=at_boundary))
    saved = output._BLOCK
    output._BLOCK = 5  # seams everywhere: a seam must never change what is shown
    try:
        seamed = (head_piece(data, budget, final=final),
                  tail_piece(data, budget, at_boundary=at_boundary))
    finally:
        output._BLOCK = saved
    assert seamed == whole
    (head, head_bytes), (tail, tail_bytes) = whole
    assert len(head) <= budget and len(tail) <= budget
    assert head == render(data[:head_bytes])
    assert tail == render(data[len(data) - tail_bytes:])
    held = len(data) if final else len(data) - _held_back(data)
    if head_bytes < held:  # the next character would not have fit
        nxt = data[head_bytes:held].decode("utf-8", "surrogateescape")[:1]
        assert len(head) + len(render(nxt.encode("utf-8", "surrogateescape"))) > budget


def _held_back(data: bytes) -> int:
    decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")
    decoder.decode(data, final=False)
    return len(decoder.getstate()[0])


def test_pieces_of_binary_output_render_only_about_what_they_keep(monkeypatch):
    data = os.urandom(4 << 20)
    rendered = []

    def counting_render(chunk: bytes) -> str:
        rendered.append(len(chunk))
        return render(chunk)

    monkeypatch.setattr(output, "render", counting_render)
    for budget in (1000, 300_000):
        rendered.clear()
        head, used = head_piece(data, budget)
        assert len(head) <= budget and used > budget // 4
        # What was rendered: the pieces kept plus at most one block more.
        assert sum(rendered) <= used + output._BLOCK + 3
        rendered.clear()
        tail, used = tail_piece(data, budget, at_boundary=False)
        assert len(tail) <= budget
        assert sum(rendered) <= used + output._BLOCK + 3


# --- until --------------------------------------------------------------------------


def test_until_is_multiline_and_linear():
    ready = compile_until("^ready")
    assert ready.search(b"starting\nready on :3000\n")
    assert not ready.search(b"not ready\n")
    assert compile_until(r"3000$").search(b"ready on :3000\nmore\n")
    # (a+)+$ takes Python's re minutes on this; RE2 does not backtrack.
    assert not compile_until(r"(a+)+$").search(b"a" * 5000 + b"!")


@pytest.mark.parametrize("pattern, words", [
    (r"(\w+) \1", "backreference (\\1)"),
    (r"(?P<x>a)(?P=x)", "named backreference"),
    (r"ready(?= on)", "lookahead"),
    (r"(?!error)", "negative lookahead"),
    (r"(?<=port )\d+", "lookbehind"),
    (r"(?>a+)b", "atomic group"),
    (r"a++", "possessive"),
    (r"done\Z", "\\Z (write \\z"),
])
def test_until_refuses_what_linear_matching_cannot_do_and_names_it(pattern, words):
    with pytest.raises(ValueError) as e:
        compile_until(pattern)
    assert words in str(e.value)
    assert "rewrite the pattern" in str(e.value)


def test_until_refuses_invalid_huge_and_too_complex_patterns():
    with pytest.raises(ValueError, match="not a valid regular expression"):
        compile_until("(unclosed")
    with pytest.raises(ValueError, match="at most 10000"):
        compile_until("x" * 10_001)
    with pytest.raises(ValueError, match="too complex"):
        compile_until(r"\pL{300}")
    with pytest.raises(ValueError, match="too complex"):
        compile_until(r"\pL{10}")


def scan_all(scan: UntilScan, ring: Ring, pattern) -> tuple[bool, int]:
    """Search everything new in `ring` as the daemon does; (found, bytes searched)."""
    searched = 0
    while (window := scan.next_window(ring)) is not None:
        data, context = window
        searched += len(data)
        if pattern.search(data, context):
            return True, searched
    return False, searched


# Patterns whose matches span at most 4 bytes and do not depend on what follows them.
SHORT_PATTERNS = ["ab", "^b", "a\nb", r"\bb", "^ab\n", "b\na", "ba+b", r"\Aa"]


@settings(max_examples=400, deadline=None)
@given(text=st.text(alphabet="ab\n", max_size=60),
       cuts=st.lists(st.integers(0, 60), max_size=15),
       pattern=st.sampled_from(SHORT_PATTERNS), start=st.integers(0, 5))
def test_windowed_until_finds_what_a_search_of_the_whole_output_finds(text, cuts, pattern,
                                                                    start):
    data = b"xy\nab" + text.encode()  # some output before the read's start
    start = min(start, len(data))
    until = compile_until(pattern)
    ring = Ring(1000)
    scan = UntilScan(start, overlap=4, piece=7)
    found = False
    prev = 0
    for cut in sorted(set(cuts)) + [len(data)]:
        cut = min(cut, len(data))
        ring.append(data[prev:cut])
        prev = cut
        found = found or scan_all(scan, ring, until)[0]
    if pattern == "ba+b":  # may be longer than the overlap: then it may be missed
        assert bool(until.search(data[start:])) or not found
    else:
        assert found == bool(until.search(data[start:]))


def test_windowed_until_searches_each_byte_a_bounded_number_of_times():
    until = compile_until(".*server ready")
    ring = Ring(1 << 20)
    scan = UntilScan(0)
    total = 0
    chunks = 0
    for i in range(3000):  # a progress bar: \r and no newline, in tiny writes
        ring.append(b"progress %d%%\r" % i)
        chunks += 1
        found, searched = scan_all(scan, ring, until)
        assert not found
        total += searched
    # Each search: its new bytes plus at most the overlap (and a few bytes of context).
    assert total <= ring.end + chunks * (UNTIL_OVERLAP_BYTES + 4)
    ring.append(b"\nthe server ready\n")
    assert scan_all(scan, ring, until)[0]
