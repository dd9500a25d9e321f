"""fdio: reads and writes that skip trio's extra yields must still be fair and cancellable."""

from __future__ import annotations

import os

import pytest
import trio

from toolsd.runtime.fdio import FdReader, write_all


@pytest.fixture
def flood():
    """A descriptor that always has data: /dev/zero, like a writer faster than any reader."""
    fd = os.open("/dev/zero", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


@pytest.mark.parametrize("options", [{}, {"wait_after_short": True}, {"yield_later": True}])
async def test_a_flood_does_not_starve_other_tasks(flood, options):
    reader = FdReader(flood, **options)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await trio.sleep(0)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        await trio.sleep(0)
        got = 0
        while got < 20 << 20:
            got += len(await reader.read(1 << 20))
        nursery.cancel_scope.cancel()
    # A reader that never yielded would leave the ticker at its first tick.
    assert ticks >= 5  # twenty reads: a turn at least every fourth


class _Yields(trio.abc.Instrument):
    """Counts the times a task gave its turn to the scheduler."""

    def __init__(self, task: trio.lowlevel.Task):
        self.task = task
        self.count = 0

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.count += 1


async def test_a_reader_that_yields_later_returns_a_floods_data_before_the_others_turn(
        flood):
    # The client socket's reader: a request read in a flood is answered before the other
    # tasks' turn, which comes at the start of the next read.
    reader = FdReader(flood, yield_later=True)
    yields = _Yields(trio.lowlevel.current_task())
    trio.lowlevel.add_instrument(yields)
    try:
        await reader.read(16)
        await reader.read(16)  # the second in a row without waiting: a turn is due
        assert yields.count == 0
        await reader.read(16)
        assert yields.count == 1
    finally:
        trio.lowlevel.remove_instrument(yields)


async def test_a_cancelled_read_takes_nothing_from_the_descriptor():
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        os.write(write_fd, b"kept")
        reader = FdReader(read_fd)
        with trio.CancelScope() as scope:
            scope.cancel()
            await reader.read(100)
        assert scope.cancelled_caught
        assert await reader.read(100) == b"kept"
        # Waiting on an empty pipe is cancellable too.
        with trio.move_on_after(0.05) as waited:
            await reader.read(100)
        assert waited.cancelled_caught
    finally:
        os.close(read_fd)
        os.close(write_fd)


async def test_write_all_waits_for_room_and_reports_a_gone_reader():
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    data = os.urandom(1 << 20)  # far more than a pipe holds
    received = []

    async def drain():
        reader = FdReader(read_fd, wait_after_short=True)
        while sum(map(len, received)) < len(data):
            received.append(await reader.read(1 << 16))

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain)
            await write_all(write_fd, data)
        assert b"".join(received) == data
    finally:
        os.close(read_fd)
    try:
        with pytest.raises(BrokenPipeError):
            await write_all(write_fd, b"x")
    finally:
        os.close(write_fd)
