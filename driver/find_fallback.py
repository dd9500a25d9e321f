"""The `find` tool inside the sandbox where there is no ripgrep: run as `python3 -c` with its
source (agent/file_tools.py sends it), standard library only.

argv: PATTERN GLOB PATH LIMIT (an empty PATTERN: file names only; an empty GLOB: every file).
Writes what `rg -n --null` writes: `path\\0line:text` per matching line, or `path` per name,
at most LIMIT+1 lines (one more than shown tells the caller there is more). Leaves out what
rg does by default: hidden entries (.git among them) and node_modules; binary files."""

import fnmatch
import os
import re
import sys

SKIP = {"node_modules", "__pycache__"}


def main():
    pattern, glob, top, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    try:
        regex = re.compile(pattern) if pattern else None
    except re.error as e:
        sys.stderr.write(f"regex parse error: {e}\n")
        sys.exit(2)
    shown = 0
    out = sys.stdout
    if os.path.isfile(top):
        walk = [(os.path.dirname(top) or ".", [], [os.path.basename(top)])]
    else:
        walk = os.walk(top)
    for folder, dirs, files in walk:
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP)
        for name in sorted(files):
            if name.startswith(".") and not os.path.isfile(top):
                continue
            path = os.path.join(folder, name)
            if path.startswith("./"):
                path = path[2:]
            if glob and not (fnmatch.fnmatch(name, glob) or fnmatch.fnmatch(path, glob)):
                continue
            if regex is None:
                out.write(path + "\n")
                shown += 1
            else:
                shown += grep(path, regex, out, limit + 1 - shown)
            if shown > limit:
                return


def grep(path, regex, out, room):
    try:
        with open(path, "rb") as f:
            data = f.read(64 << 20)
    except OSError:
        return 0
    if b"\0" in data[:8192]:
        return 0
    n = 0
    for number, line in enumerate(data.decode("utf-8", "replace").split("\n"), 1):
        if n >= room:
            break
        if regex.search(line):
            out.write(f"{path}\0{number}:{line}\n")
            n += 1
    return n


if __name__ == "__main__":
    main()
