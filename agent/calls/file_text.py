"""What the file tools compute, pure (agent/calls/file_tools.py does the reading and writing):
a file's kind from its first bytes, its lines numbered within the result's room, an edit's
new text (or why it cannot be made), and where the closest match of a missed `old` is."""

from __future__ import annotations

import difflib
import hashlib

from agent.calls.results import RESULT_CHARS, one_line

__all__ = ["kind_of", "numbered", "apply_edit", "EditError", "digest", "LINE_CHARS"]

LINE_CHARS = 500  # of one line shown by read_file; a longer one is cut and says so
NOTICE_ROOM = 300  # kept free for the line that says what was left out
SNIFF_BYTES = 8192

IMAGE_MAGIC = [(b"\x89PNG\r\n\x1a\n", "PNG"), (b"\xff\xd8\xff", "JPEG"), (b"GIF8", "GIF"),
               (b"BM", "BMP")]


def digest(data: bytes | None) -> str:
    """What a file held, to tell at apply time whether it changed since the diff."""
    return "absent" if data is None else hashlib.sha256(data).hexdigest()


def kind_of(head: bytes) -> str | None:
    """None for text; else what the file is ("a PNG image", "binary")."""
    for magic, name in IMAGE_MAGIC:
        if head.startswith(magic):
            return f"a {name} image"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "a WebP image"
    if b"\0" in head[:SNIFF_BYTES]:
        return "binary"
    try:
        head[:SNIFF_BYTES].decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head[:SNIFF_BYTES]) - 4:  # not just a character cut at the end
            return "binary"
    return None


def numbered(text: str, first: int, limit: int | None, *, complete: bool,
             room: int = RESULT_CHARS) -> str:
    """Lines `first`.. (1-based) of `text`, numbered as `cat -n` does, at most `limit` of them
    and within `room` characters; then a line saying what is left and how to read it.
    `complete`: `text` is the whole file (else more follows it)."""
    lines = text.split("\n")
    if complete and lines and lines[-1] == "":
        lines.pop()
    total = len(lines) if complete else None
    if first > len(lines):
        if total is not None:
            return f"[the file has {total} lines: there is no line {first}]"
        return f"[line {first} is past what read_file reads of this file: use run_terminal " \
               f"with sed -n '{first},+100p']"
    out, used, last = [], 0, first - 1
    for n in range(first, len(lines) + 1):
        if limit is not None and n >= first + limit:
            break
        line = lines[n - 1]
        if len(line) > LINE_CHARS:
            line = line[:LINE_CHARS] + f" [... line cut: {len(line)} characters]"
        row = f"{n:6}\t{line}\n"
        if used + len(row) > room - NOTICE_ROOM:
            break
        out.append(row)
        used += len(row)
        last = n
    body = "".join(out) or "(empty file)\n"
    if total is not None and last >= total:
        return body.rstrip("\n")
    of = f" of {total}" if total is not None else ""
    return body + f"[lines {first}-{last}{of} shown; read on with offset: {last + 1}]"


class EditError(Exception):
    """Why an edit cannot be made, in words the model acts on."""


def apply_edit(text: str, old: str, new: str, all_: bool, path: str) -> str:
    """`text` with `old` replaced by `new`: once, where it matches exactly once, or every
    match with `all_`. Raises EditError naming why not (no match: where the closest is)."""
    if old == "":
        raise EditError("edit_file: `old` is empty; to write a whole file use write_file")
    if old == new:
        raise EditError("edit_file: `old` and `new` are the same: nothing would change")
    count = text.count(old)
    if count == 0:
        raise EditError(f"edit_file: `old` was not found in {path}. {closest(text, old)} "
                        f"Read the file (read_file) and copy `old` exactly, spaces included.")
    if count > 1 and not all_:
        lines = _match_lines(text, old)
        raise EditError(f"edit_file: `old` matches {count} times in {path} (at lines "
                        f"{', '.join(map(str, lines[:10]))}): add surrounding lines to make it "
                        f"match once, or send all: true to replace every one")
    return text.replace(old, new) if all_ else text.replace(old, new, 1)


def _match_lines(text: str, old: str) -> list[int]:
    lines, at = [], text.find(old)
    while at != -1:
        lines.append(text.count("\n", 0, at) + 1)
        at = text.find(old, at + len(old))
    return lines


def closest(text: str, old: str) -> str:
    """Where the text is most like `old`: a window of as many lines, best by ratio."""
    lines = text.split("\n")
    old = old.strip("\n") or old
    size = old.count("\n") + 1
    if not text.strip():
        return "The file is empty."
    best, best_at = 0.0, 0
    # Bounded: a large file is compared by its lines' first characters only after a cut.
    windows = range(max(1, len(lines) - size + 1))
    for i in windows[:5000]:
        chunk = "\n".join(lines[i:i + size])
        m = difflib.SequenceMatcher(None, chunk[:1000], old[:1000], autojunk=False)
        if m.real_quick_ratio() <= best or m.quick_ratio() <= best:
            continue
        r = m.ratio()
        if r > best:
            best, best_at = r, i
    if best < 0.3:
        return "Nothing in it is close."
    shown = one_line("\n".join(lines[best_at:best_at + size]), 300)
    end = best_at + min(size, len(lines) - best_at)
    where = f"line {best_at + 1}" if end == best_at + 1 else f"lines {best_at + 1}-{end}"
    return f"The closest is at {where} ({best:.0%} alike): {shown}"
