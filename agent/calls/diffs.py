"""The unified diff a person approves before write_file or edit_file touch a file, and its
colors on a terminal. Pure."""

from __future__ import annotations

import difflib

__all__ = ["unified", "colored", "DIFF_LINES"]

DIFF_LINES = 400  # shown of one diff; the rest is counted


def unified(path: str, before: str | None, after: str) -> str:
    """The diff from `before` (None: the file does not exist yet) to `after`, as `diff -u`
    writes it, at most DIFF_LINES lines."""
    old = [] if before is None else before.splitlines(keepends=True)
    new = after.splitlines(keepends=True)
    lines = list(difflib.unified_diff(old, new, "/dev/null" if before is None else f"a/{path}",
                                      f"b/{path}", n=3))
    fixed = []
    for line in lines:
        if not line.endswith("\n"):
            line += "\n\\ No newline at end of file\n"
        fixed.append(line)
    if not fixed:
        return f"(no change to {path})\n"
    if len(fixed) > DIFF_LINES:
        rest = len(fixed) - DIFF_LINES
        fixed = fixed[:DIFF_LINES] + [f"... {rest} more diff lines not shown\n"]
    return "".join(fixed)


RED, GREEN, CYAN, BOLD, RESET = "\x1b[31m", "\x1b[32m", "\x1b[36m", "\x1b[1m", "\x1b[0m"


def colored(diff: str) -> str:
    """`diff` for a terminal: removed lines red, added green, hunk heads cyan."""
    out = []
    for line in diff.splitlines(keepends=True):
        body = line.rstrip("\n")
        end = line[len(body):]
        if line.startswith(("---", "+++")):
            out.append(f"{BOLD}{body}{RESET}{end}")
        elif line.startswith("@@"):
            out.append(f"{CYAN}{body}{RESET}{end}")
        elif line.startswith("-"):
            out.append(f"{RED}{body}{RESET}{end}")
        elif line.startswith("+"):
            out.append(f"{GREEN}{body}{RESET}{end}")
        else:
            out.append(line)
    return "".join(out)
