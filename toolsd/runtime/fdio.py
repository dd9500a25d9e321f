"""Reads and writes on non-blocking descriptors with as few passes through trio's scheduler as
correctness allows.

trio's streams yield on every call, even when the data is already there: a read is a yield, a
failed read, an epoll registration, a wait and a second read, and each yield is a pass of the
scheduler (an epoll_wait and a batch of bookkeeping). A request to the daemon went through a
dozen of them. Here a call tries the system call first and waits only when it would block.

Still a checkpoint in trio's sense: a cancelled caller gets Cancelled before anything is read
or written. Fairness is kept by FdReader, which yields when it keeps finding data without ever
waiting (a flood), so no reader starves the other tasks.
"""

from __future__ import annotations

import fcntl
import os
import struct
import termios

import trio

# What one read asks for, at most. A read first makes a bytes object of the size asked, then
# shrinks it; over glibc's mmap threshold (128 KiB unless raised) that is an mmap, an mremap
# and a munmap per read, and fresh pages to fault in, depending on the process's allocation
# history; 64 KiB stays under it. A pipe holds 64 KiB unless resized, so a flood loses
# nothing.
READ_SIZE = 64 * 1024


def unread(fd: int) -> int:
    """Bytes in the pipe or socket at `fd` that no reader took yet (FIONREAD). OSError is
    the caller's."""
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]


class FdReader:
    """`wait_after_short`: after a read that took less than it asked, the next read waits for
    the descriptor first rather than failing with EAGAIN (a system call and an exception
    saved). Right where data comes in separate bursts, like a command's output; slower on the
    client socket, where the next request often follows the reply at once. `wait_first`: the
    first read waits too, as for the pipe of a command that has only just started.
    `yield_later`: in a flood, the turn given to the other tasks comes at the start of the
    next read instead of before the data is returned: for a caller that answers what it
    reads (the client socket), whose answer then goes out first."""

    def __init__(self, fd: int, *, wait_after_short: bool = False, wait_first: bool = False,
                 yield_later: bool = False):
        self.fd = fd
        self._streak = 0  # reads in a row that found data without waiting
        self._wait_after_short = wait_after_short
        self._drained = wait_first  # the last read was short: the next one waits first
        self._yield_later = yield_later
        self._yield_now = False  # a flood's turn for the others, left to this read

    def wait_next(self) -> None:
        """The next read waits for the descriptor first, as after a short read: for a
        caller that knows nothing can have come yet (a client waiting for an answer that
        is not out)."""
        self._drained = True

    async def read(self, max_bytes: int) -> bytes:
        """What is there to read, waiting until something is; b"" at end of file. OSError
        other than EAGAIN is the caller's."""
        if self._drained:
            self._drained = self._yield_now = False
            self._streak = 0
            await trio.lowlevel.wait_readable(self.fd)
        elif self._yield_now:
            self._yield_now = False
            await trio.lowlevel.checkpoint()
        else:
            await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            try:
                data = os.read(self.fd, max_bytes)
            except BlockingIOError:
                self._streak = 0
                await trio.lowlevel.wait_readable(self.fd)
                continue
            self._drained = self._wait_after_short and len(data) < max_bytes
            self._streak += 1
            if self._streak > 1:
                # A flood: let the others run. Shielded, so that the data just read is
                # returned rather than lost to a cancellation.
                self._streak = 0
                if self._yield_later:
                    self._yield_now = True
                else:
                    await trio.lowlevel.cancel_shielded_checkpoint()
            return data


async def write_all(fd: int, data: bytes, started=None) -> None:
    """Write all of `data`, waiting whenever the other end is full. OSError (EPIPE: the reader
    is gone) is the caller's. `started()`, if given, is called right after the first write
    (whether or not the other end took anything), before any wait."""
    await trio.lowlevel.checkpoint_if_cancelled()
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
            full = False
        except BlockingIOError:
            full = True
        if started is not None:
            started, call = None, started
            call()
        if full:
            await trio.lowlevel.wait_writable(fd)
