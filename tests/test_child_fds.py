"""A child's start closes its descriptors by structure (toolsd/runtime/child_fds.py): the
child's ends always, ours only when the start fails, cancelled included."""

from __future__ import annotations

import os

import pytest
import trio

from toolsd.runtime.child_fds import ChildFds


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def test_a_start_that_succeeds_keeps_ours_and_closes_the_childs():
    with ChildFds() as fds:
        ours, theirs = fds.pipe()
        into, writer = fds.pipe_in(os.O_NONBLOCK)
        sock, child_sock = fds.socketpair()
        assert all(map(is_open, (ours, theirs, into, writer)))
    assert is_open(ours) and is_open(writer) and sock.fileno() != -1
    assert not is_open(theirs) and not is_open(into) and child_sock.fileno() == -1
    assert not os.get_blocking(writer)
    # The child's end is gone, so ours sees EOF, as the caller's read of a finished child.
    assert os.read(ours, 10) == b""
    os.close(ours)
    os.close(writer)
    sock.close()


def test_a_start_that_fails_closes_everything():
    with pytest.raises(OSError):
        with ChildFds() as fds:
            ours, theirs = fds.pipe()
            sock, child_sock = fds.socketpair()
            raise OSError("the spawn failed")
    assert not is_open(ours) and not is_open(theirs)
    assert sock.fileno() == -1 and child_sock.fileno() == -1


async def test_a_cancelled_start_closes_everything():
    with trio.move_on_after(0.01):
        with ChildFds() as fds:
            ours, theirs = fds.pipe()
            await trio.sleep_forever()
    assert not is_open(ours) and not is_open(theirs)
