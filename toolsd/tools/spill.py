"""The whole output of a `shell.run` or `repl.exec` asked with `spill: true`, kept in the
session's scratch when the answer had to cut it (protocol 1.1, "spill").

A caller shown a head and a tail can then grep or page the rest instead of running the
command again. Output that fits never touches the disk: it is held in memory until it is
certain not to fit (more than 4 bytes per character of the budget, since no byte renders as
more than 4 characters), and only then written out.

Resource handling: `Spills` belongs to its Session and is the only writer of its files; each
call's `Spill` owns one file descriptor from its first write until `finish()` or `discard()`
(one of which its call always reaches). The files go with the scratch folder at session close.
"""

from __future__ import annotations

import collections
import os

__all__ = ["Spill", "Spills", "tee"]

# Tries at a fresh name when sandboxed code already made files with the next ones.
NAME_TRIES = 64
NAME = "toolsd-output-{}.txt"
# At most this many spill files per session (the oldest go first), however small: a client
# asking for a spill of every tiny output must not fill the folder with files.
MAX_FILES = 256


class Spills:
    """The spill files of one session. Each holds at most `file_cap` bytes, and together they
    hold at most that too, in at most MAX_FILES files: the oldest are deleted first, so floods
    cannot fill the disk.

    Files are created directly in the scratch folder (which sandboxed code cannot replace: it
    is the sandbox's /tmp mount point) with O_EXCL | O_NOFOLLOW, so a name planted there by
    the session (a symlink, a fifo) is skipped, never followed or written through."""

    def __init__(self, folder: str, visible: str, file_cap: int):
        self.folder = folder
        self.visible = visible  # the folder as the session's commands see it
        self.file_cap = file_cap
        self._count = 0
        self._kept: collections.deque[tuple[str, int]] = collections.deque()  # (name, size)
        self._kept_bytes = 0

    def start(self, max_chars: int) -> Spill:
        return Spill(self, max_chars)

    def _create(self) -> tuple[int, str] | None:
        for _ in range(NAME_TRIES):
            self._count += 1
            name = NAME.format(self._count)
            try:
                fd = os.open(os.path.join(self.folder, name),
                             os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o644)
            except FileExistsError:
                continue
            except OSError:
                return None
            return fd, name
        return None

    def _keep(self, name: str, size: int) -> str:
        self._kept.append((name, size))
        self._kept_bytes += size
        while (self._kept_bytes > self.file_cap or len(self._kept) > MAX_FILES) and \
                len(self._kept) > 1:
            old, old_size = self._kept.popleft()
            self._kept_bytes -= old_size
            _unlink(os.path.join(self.folder, old))
        return os.path.join(self.visible, name)

    def _drop(self, name: str) -> None:
        _unlink(os.path.join(self.folder, name))


class Spill:
    """The whole output of one call: fed every byte, it keeps them (up to its session's file
    cap) in memory or in its file; `finish(truncated)` says where they are, if anywhere."""

    def __init__(self, owner: Spills, max_chars: int):
        self._owner = owner
        self._held = bytearray()
        self._hold_limit = 4 * max_chars + 4
        self._fd: int | None = None
        self._name: str | None = None
        self._written = 0
        self._left_out = 0
        self._failed = False
        self._done = False
        self._path: str | None = None

    def feed(self, data: bytes) -> None:
        if self._done or self._failed:
            return
        if self._fd is None:
            self._held += data
            if len(self._held) > self._hold_limit:
                self._spill()
            return
        self._write(data)

    def _spill(self) -> None:
        made = self._owner._create()
        if made is None:
            self._failed = True
            self._held = bytearray()
            return
        self._fd, self._name = made
        held, self._held = self._held, bytearray()
        self._write(held)

    def _write(self, data) -> None:
        room = self._owner.file_cap - self._written
        if room < len(data):
            self._left_out += len(data) - max(room, 0)
            data = memoryview(data)[:max(room, 0)]
        try:
            while len(data):
                n = os.write(self._fd, data)
                self._written += n
                data = memoryview(data)[n:]
        except OSError:
            self._failed = True  # a full disk: the file keeps what it has, and says so

    def finish(self, truncated: bool) -> str | None:
        """The path of the whole output as the session sees it, if `truncated` and it could
        be kept; the held bytes and the file descriptor are released either way. Asked
        again, the same answer."""
        if self._done:
            return self._path
        if truncated and self._fd is None and not self._failed:
            self._spill()
        self._done = True
        self._held = bytearray()
        if self._fd is None:
            return None
        fd, self._fd = self._fd, None
        name = self._name
        try:
            if not truncated:
                self._owner._drop(name)
                return None
            if self._left_out or self._failed:
                try:
                    os.write(fd, self._cut_note().encode())
                except OSError:
                    pass
            self._path = self._owner._keep(name, self._written)
            return self._path
        finally:
            os.close(fd)

    def _cut_note(self) -> str:
        if self._failed:
            return "\n[toolsd: the output could not all be written here (disk full?)]\n"
        return (f"\n[toolsd: the output ends here at the session's file size limit "
                f"({self._owner.file_cap} bytes); {self._left_out} more bytes were not kept]\n")

    def discard(self) -> None:
        """The call ended without a result (cancelled): nothing is kept."""
        if self._done:
            return
        self._done = True
        self._held = bytearray()
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
            self._owner._drop(self._name)


def tee(first, second):
    """A sink that feeds `first`, then `second` (the bounded view, then the spill)."""
    def feed(data: bytes) -> None:
        first(data)
        second(data)
    return feed


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass  # already gone, or the session put a folder there
