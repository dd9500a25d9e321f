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
    """Two lists, not ExitStacks: a spawn makes one or two of these on every call, and an
    ExitStack's callbacks cost several Python calls each."""

    def __init__(self) -> None:
        self._always: list = []
        self._on_failure: list = []

    def child(self, fd: Fd) -> Fd:
        """`fd` is the child's: closed here when the block ends."""
        self._always.append(fd)
        return fd

    def ours(self, fd: Fd) -> Fd:
        """`fd` is the caller's once the start succeeds: closed here only if it fails."""
        self._on_failure.append(fd)
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
        # Every one is closed (those given for a failure first, each list last given first),
        # even if closing one fails; the first failure is raised once all are closed.
        fds = self._always if kind is None else self._always + self._on_failure
        self._always, self._on_failure = [], []
        failure = None
        for fd in reversed(fds):
            try:
                _close(fd)
            except BaseException as e:  # noqa: BLE001 - raised below, once all are closed
                failure = failure or e
        if failure is not None:
            raise failure
