"""The `until` search of process.output: a client's RE2 pattern over a process's new output,
in windows, without backtracking. Pure."""

from __future__ import annotations

import re

import re2

from toolsd.tools.output import Ring, render, safe_split

# `until` patterns come from clients and are matched against output a sandboxed program
# chose: RE2 matches in time linear in the text (no backtracking), so no pattern can stall
# the daemon the way `(a+)+$` stalls Python's `re`.
def _re2_options(max_mem: int):
    options = re2.Options()
    options.log_errors = False  # errors are reported to the client, not to our stderr
    options.max_mem = max_mem
    return options


# Compiling holds the interpreter for as long as it takes (long, for a big Unicode class):
# a probe with little memory refuses a huge program within milliseconds, and only a pattern
# that passes is compiled for searching, with room for RE2's DFA cache (each search's own:
# nothing is cached across requests, so hostile patterns cannot pile up memory).
_PROBE_OPTIONS = _re2_options(256 << 10)
_SEARCH_OPTIONS = _re2_options(2 << 20)
# A program this small leaves the probe's own memory room enough for its DFA, which then
# searches as fast as one compiled with _SEARCH_OPTIONS: the probe is kept and the pattern
# is compiled once. A bigger program's DFA would not fit and RE2 would fall back to its
# slower NFA, so it is compiled again with room.
PROBE_SEARCHES_UP_TO = 256
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
    if size <= PROBE_SEARCHES_UP_TO:
        return UntilPattern(probe, size)
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
            lo = pre + safe_split(data, lo - pre)
        self.scanned = end
        head, window = data[: lo - pre], data[lo - pre :]
        return window, render(head)[-1:]
