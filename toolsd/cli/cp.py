"""`toolsd cp LOCAL SESSION:PATH` and `toolsd cp SESSION:PATH LOCAL`: copy a file or a whole
folder into or out of a session (client/copy.py), with a progress bar on a terminal."""

from __future__ import annotations

import re
import sys
import time

from toolsd.cli.common import target_of
from toolsd.client import copy

# SESSION:PATH, as scp writes HOST:PATH; a local path with a colon before its first slash is
# written ./like:this.
_REMOTE = re.compile(r"^([A-Za-z0-9_.-]+):(.*)$", re.S)


def add_parser(sub, common) -> None:
    p = sub.add_parser(
        "cp", parents=[common],
        help="copy files or folders into or out of a session",
        description="Copy a file or a whole folder between this machine and a session, as "
                    "`cp -r` would: into a folder that exists, else to the name given. "
                    "Symlinks are copied as links, special files skipped and counted. "
                    "SESSION:PATH is a path as the session sees it (relative: from its "
                    "workspace); `toolsd ps` lists the sessions.")
    p.add_argument("source", metavar="SOURCE", help="LOCAL or SESSION:PATH")
    p.add_argument("target", metavar="TARGET", help="SESSION:PATH or LOCAL")
    p.add_argument("--parallel", type=int, default=copy.PARALLEL, metavar="N",
                   help=f"requests in flight at once (default: {copy.PARALLEL})")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar, no summary")
    p.set_defaults(func=cmd_cp)


def cmd_cp(args) -> int:
    source, target = _REMOTE.match(args.source), _REMOTE.match(args.target)
    if bool(source) == bool(target):
        print("toolsd cp: give one side as SESSION:PATH and the other as a local path "
              "(write a local name with a colon as ./name:x)", file=sys.stderr)
        return 2
    if args.parallel < 1:
        print("toolsd cp: --parallel must be 1 or more", file=sys.stderr)
        return 2
    bar = _Bar() if not args.quiet and sys.stderr.isatty() else None
    options = {"parallel": args.parallel, "progress": bar}
    started = time.monotonic()
    try:
        if target:
            stats = copy.run_blocking(target_of(args), copy.upload, args.source,
                                      target[1], target[2] or ".", **options)
        else:
            stats = copy.run_blocking(target_of(args), copy.download, source[1],
                                      source[2] or ".", args.target, **options)
    except OSError as e:
        print(f"toolsd cp: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 1
    finally:
        if bar is not None:
            bar.end()
    if not args.quiet:
        took = time.monotonic() - started
        print(f"{stats.files} files, {stats.dirs} folders, {stats.symlinks} symlinks, "
              f"{_size(stats.bytes)} in {took:.1f} s"
              + (f"; {stats.skipped} special files skipped" if stats.skipped else ""),
              file=sys.stderr)
    return 0


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class _Bar:
    """One line on stderr, redrawn at most ten times a second."""

    WIDTH = 30

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.last = 0.0
        self.drawn = False

    def __call__(self, stats) -> None:
        now = time.monotonic()
        if now - self.last < 0.1 and stats.files < stats.total_files:
            return
        self.last = now
        total = stats.total_bytes or 1
        done = min(1.0, stats.bytes / total)
        fill = int(done * self.WIDTH)
        rate = stats.bytes / max(now - self.started, 1e-6)
        sys.stderr.write(f"\r[{'#' * fill}{'.' * (self.WIDTH - fill)}] {stats.files}/"
                         f"{stats.total_files} files  {_size(stats.bytes)}  "
                         f"{_size(rate)}/s \x1b[K")
        sys.stderr.flush()
        self.drawn = True

    def end(self) -> None:
        if self.drawn:
            sys.stderr.write("\n")
            sys.stderr.flush()
