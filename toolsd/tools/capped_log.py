"""A background process's output on disk within a cap: the log file that process.output and
`toolsd logs` read back by offset. File I/O, synchronous."""

from __future__ import annotations

import os
import threading

from toolsd.tools.output import check_read

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
        check_read(since, limit)
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
