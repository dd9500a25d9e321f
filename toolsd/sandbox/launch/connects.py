"""Connects made inside a sandbox for the daemon (port.forward): the requests in flight on
the launcher channel and their answers, a socket each (driver/port_connect.py makes it in
the sandbox's network namespace and passes it back with SCM_RIGHTS).

Resource handling: an answer's fd is its waiter's from the moment it arrives; a waiter that
leaves without taking it (cancelled, or the launcher died meanwhile) has it closed here, so
no socket is ever left open by a connect nobody waits for.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator

import trio

from toolsd.sandbox.launch.channel import Connected


class ConnectFailed(OSError):
    """The launcher could not connect (refused at once, no such address...)."""


class Waiter:
    def __init__(self) -> None:
        self.answered = trio.Event()
        self.fd = -1
        self.error: OSError | None = None

    def take(self) -> int:
        """The answer's fd, now the caller's; the error if there is none."""
        if self.error is not None:
            raise self.error
        fd, self.fd = self.fd, -1
        return fd


class Connects:
    """The launcher's connect requests in flight, by request number."""

    def __init__(self) -> None:
        self._waiting: dict[int, Waiter] = {}

    @contextlib.contextmanager
    def expect(self, n: int) -> Iterator[Waiter]:
        waiter = self._waiting[n] = Waiter()
        try:
            yield waiter
        finally:
            self._waiting.pop(n, None)
            if waiter.fd >= 0:
                os.close(waiter.fd)
                waiter.fd = -1

    def answer(self, msg: Connected, fds: list[int]) -> None:
        """The launcher's answer; the fd it takes from `fds` is the waiter's."""
        waiter = self._waiting.pop(msg.n, None)
        if waiter is None:
            return  # nobody waits any more: the caller closes fds
        if msg.error or not fds:
            waiter.error = ConnectFailed(msg.errno or errno.EIO, msg.error or "no socket")
        else:
            waiter.fd = fds.pop(0)
        waiter.answered.set()

    def fail_all(self, reason: str) -> None:
        """The launcher is gone: every waiter gets `reason`."""
        for waiter in self._waiting.values():
            waiter.error = ConnectFailed(errno.ECONNABORTED, reason)
            waiter.answered.set()
        self._waiting.clear()
