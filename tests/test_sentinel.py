"""SentinelScanner: only the sentinel of the request in flight ends it; everything else is
output, byte for byte, however the stream is split."""

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from toolsd.tools.sentinel import MARKER_PREFIX, Sentinel, SentinelScanner, format_sentinel

UUID = "0123456789abcdef0123456789abcdef"
OTHER = "fedcba9876543210fedcba9876543210"


def scan_all(scanner: SentinelScanner, chunks) -> tuple[bytes, list[Sentinel]]:
    out, found = [], []
    for chunk in chunks:
        data, sentinel = scanner.feed(chunk)
        out.append(data)
        while sentinel is not None:
            found.append(sentinel)
            data, sentinel = scanner.feed(b"")
            out.append(data)
    out.append(scanner.flush())
    return b"".join(out), found


def test_sentinel_ends_request_and_output_before_it_is_kept():
    scanner = SentinelScanner(UUID)
    scanner.expect(1)
    out, sentinel = scanner.feed(b"hello" + format_sentinel(UUID, 1, "ok"))
    assert out == b"hello"
    assert sentinel == Sentinel(1, {"status": "ok"})


def test_output_without_newline_is_not_altered():
    scanner = SentinelScanner(UUID)
    scanner.expect(1)
    out, sentinel = scanner.feed(b"no newline" + format_sentinel(UUID, 1, "error"))
    assert out == b"no newline"
    assert sentinel.status == {"status": "error"}


def test_wrong_uuid_is_output():
    forged = format_sentinel(OTHER, 1, "ok")
    scanner = SentinelScanner(UUID)
    scanner.expect(1)
    out, sentinel = scanner.feed(forged + b"after")
    assert sentinel is None
    assert out + scanner.flush() == forged + b"after"


def test_future_seq_is_output_and_stale_seq_is_dropped():
    scanner = SentinelScanner(UUID)
    scanner.expect(2)
    stream = (
        b"a" + format_sentinel(UUID, 1, "ok")  # stale: dropped
        + b"b" + format_sentinel(UUID, 3, "ok")  # never sent: output
        + b"c" + format_sentinel(UUID, 2, "interrupted") + b"next"
    )
    out, sentinel = scanner.feed(stream)
    assert out == b"ab" + format_sentinel(UUID, 3, "ok") + b"c"
    assert sentinel == Sentinel(2, {"status": "interrupted"})
    # Bytes after the sentinel belong to what comes next.
    scanner.expect(3)
    assert scanner.feed(b"") == (b"next", None)


def test_a_sentinel_is_returned_once():
    scanner = SentinelScanner(UUID)
    scanner.expect(1)
    real = format_sentinel(UUID, 1, "ok")
    assert scanner.feed(real)[1] is not None
    # The same line again (a replay) is stale, not a second end.
    assert scanner.feed(real + b"x") == (b"x", None)


def test_garbage_after_marker_is_output():
    marker = MARKER_PREFIX + UUID.encode() + b":"
    cases = [
        marker + b"1:notjson\n",
        marker + b"1:{\"status\": 5}\n",
        marker + b"1:{broken\n",
        marker + b"x1:{}\n",
        marker + b"1\n",
        marker + b"1:" + b"{" + b"a" * 1000,
    ]
    for case in cases:
        scanner = SentinelScanner(UUID)
        scanner.expect(1)
        out, sentinel = scanner.feed(case)
        assert sentinel is None, case
        assert out + scanner.flush() == case


def test_marker_inside_garbage_still_finds_real_sentinel():
    marker = MARKER_PREFIX + UUID.encode() + b":"
    scanner = SentinelScanner(UUID)
    scanner.expect(1)
    real = format_sentinel(UUID, 1, "ok")
    out, sentinel = scanner.feed(marker + b"12" + real)
    assert out == marker + b"12"
    assert sentinel == Sentinel(1, {"status": "ok"})


def test_partial_marker_is_held_back_until_it_resolves():
    real = format_sentinel(UUID, 1, "ok")
    scanner = SentinelScanner(UUID)
    scanner.expect(1)
    out, sentinel = scanner.feed(b"abc" + real[:5])
    assert (out, sentinel) == (b"abc", None)
    out, sentinel = scanner.feed(real[5:-1])
    assert (out, sentinel) == (b"", None)
    out, sentinel = scanner.feed(real[-1:])
    assert (out, sentinel) == (b"", Sentinel(1, {"status": "ok"}))


def test_partial_marker_at_eof_is_output():
    real = format_sentinel(UUID, 1, "ok")
    scanner = SentinelScanner(UUID)
    scanner.expect(1)
    assert scanner.feed(real[:-1]) == (b"", None)
    assert scanner.flush() == real[:-1]


def test_large_output_is_linear_and_intact():
    scanner = SentinelScanner(UUID)
    scanner.expect(1)
    chunk = (b"x" * 1023 + b"\x1e") * 64  # \x1e everywhere: worst case for the tail check
    total = 0
    for _ in range(50 * 1024 * 1024 // len(chunk)):
        out, sentinel = scanner.feed(chunk)
        assert sentinel is None
        total += len(out)
    out, sentinel = scanner.feed(format_sentinel(UUID, 1, "ok"))
    total += len(out)
    assert sentinel is not None
    assert total == 50 * 1024 * 1024


pieces = st.lists(
    st.one_of(
        st.binary(max_size=40),
        st.sampled_from(
            [
                format_sentinel(OTHER, 1, "ok"),
                format_sentinel(UUID, 9, "ok"),  # never sent
                MARKER_PREFIX + UUID.encode() + b":1:{oops\n",
                MARKER_PREFIX + UUID.encode()[:10],
                MARKER_PREFIX,
                b"\x1e",
                b">>> ",
                b"... ",
            ]
        ),
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(before=pieces, after=pieces, cuts=st.lists(st.integers(min_value=0), max_size=20))
def test_random_splits_give_exact_output_and_sentinel(before, after, cuts):
    stale = format_sentinel(UUID, 1, "ok")
    real = format_sentinel(UUID, 2, "error")
    head = b"".join(before)
    tail = b"".join(after)
    stream = stale + head + real + tail
    points = sorted({c % (len(stream) + 1) for c in cuts})
    chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)])]
    scanner = SentinelScanner(UUID)
    scanner.expect(2)
    out, found = scan_all(scanner, chunks)
    assert found == [Sentinel(2, {"status": "error"})]
    # A forged piece may combine with its neighbours into new forged text, but the bytes
    # are always exactly the user's: nothing lost, nothing added, nothing reordered.
    assert out == head + tail


def test_every_split_position_of_the_sentinel():
    stream = b"out" + format_sentinel(UUID, 1, "ok") + b"rest"
    for cut in range(len(stream) + 1):
        for cut2 in range(cut, len(stream) + 1, 7):
            scanner = SentinelScanner(UUID)
            scanner.expect(1)
            out, found = scan_all(scanner, [stream[:cut], stream[cut:cut2], stream[cut2:]])
            assert found == [Sentinel(1, {"status": "ok"})], cut
            assert out == b"outrest"


def test_random_bytes_pass_through():
    blob = os.urandom(1 << 16) + MARKER_PREFIX + UUID.encode()
    scanner = SentinelScanner(UUID)
    scanner.expect(1)
    out, found = scan_all(scanner, [blob[i : i + 1000] for i in range(0, len(blob), 1000)])
    assert found == []
    assert out == blob
