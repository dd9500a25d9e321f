import os
import re
import threading
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolsd.output import CappedLog, HeadTail, Ring, clip, render

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


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.integers(min_value=1, max_value=20),
    ops=st.lists(
        st.one_of(
            st.binary(min_size=0, max_size=30).map(lambda b: ("append", b)),
            st.tuples(
                st.just("read"), st.integers(min_value=0, max_value=200), st.integers(0, 40)
            ),
        ),
        max_size=30,
    ),
)
def test_ring_matches_a_full_copy_of_the_stream(capacity, ops):
    ring = Ring(capacity)
    stream = b""
    for op in ops:
        if op[0] == "append":
            ring.append(op[1])
            stream += op[1]
            continue
        _, since, limit = op
        start = max(0, len(stream) - capacity)
        if since >= len(stream):
            assert ring.read(since, limit) == (b"", len(stream), 0)
            continue
        pos = max(since, start)
        want = stream[pos : pos + limit]
        assert ring.read(since, limit) == (want, pos + len(want), max(0, start - since))


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
