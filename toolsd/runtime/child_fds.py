"""The descriptors of one child's start, closed by structure rather than in `except` blocks
(trio's _open_process keeps two ExitStacks the same way).

    with ChildFds() as fds:
        ours, theirs = fds.pipe()          # ours: the caller's if the start succeeds
        stdin = fds.child(open_devnull())  # the child's: always closed here
        job = await spawn(..., stdin=stdin, stdout=theirs)
    return job, ours

The child's ends are closed when the block ends, however it ends (the child has its own
copies by then, so its exit gives ours EOF); ours only if the block raised (cancelled too).
"""

from __future__ import annotations

import contextlib
import os
import socket
from typing import TypeVar

__all__ = ["ChildFds"]

# A descriptor, or what holds one and has close(): a socket, a file.
Fd = TypeVar("Fd")


def _close(fd) -> None:
    if isinstance(fd, int):
        os.close(fd)
    else:
        fd.close()


class ChildFds:
    def __init__(self) -> None:
        self._always = contextlib.ExitStack()
        self._on_failure = contextlib.ExitStack()

    def child(self, fd: Fd) -> Fd:
        """`fd` is the child's: closed here when the block ends."""
        self._always.callback(_close, fd)
        return fd

    def ours(self, fd: Fd) -> Fd:
        """`fd` is the caller's once the start succeeds: closed here only if it fails."""
        self._on_failure.callback(_close, fd)
        return fd

    def socketpair(self, kind: int = socket.SOCK_STREAM) -> tuple[socket.socket, socket.socket]:
        """(ours, the child's): a pair of connected AF_UNIX sockets."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, kind)
        return self.ours(ours), self.child(theirs)

    def pipe(self) -> tuple[int, int]:
        """(read end, ours; write end, the child's), close-on-exec."""
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        return self.ours(read_fd), self.child(write_fd)

    def pipe_in(self, flags: int = 0) -> tuple[int, int]:
        """(read end, the child's; write end, ours), close-on-exec (and `flags`): the
        child's input."""
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC | flags)
        return self.child(read_fd), self.ours(write_fd)

    def __enter__(self) -> ChildFds:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        try:
            if kind is not None:
                self._on_failure.close()
            else:
                self._on_failure.pop_all()
        finally:
            self._always.close()
