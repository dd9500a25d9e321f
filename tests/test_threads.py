"""runtime/threads.py: the worker-thread pools, and taking a slot of one (`held`)."""

from __future__ import annotations

import contextlib

import pytest
import trio

from toolsd.runtime import threads


async def test_a_free_slot_is_taken_without_letting_other_tasks_run_first():
    order = []

    async def other() -> None:
        order.append("other")

    pool = trio.CapacityLimiter(1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        async with threads.held(pool):
            order.append("held")
    assert order == ["held", "other"]


@pytest.mark.parametrize("make", [lambda: trio.CapacityLimiter(1), lambda: trio.Semaphore(1),
                                  trio.Lock], ids=["limiter", "semaphore", "lock"])
async def test_a_taken_slot_is_waited_for_and_given_back_even_on_error(make):
    slots = make()
    inside = []

    async def user(name: str, fail: bool) -> None:
        with pytest.raises(RuntimeError) if fail else contextlib.nullcontext():
            async with threads.held(slots):
                inside.append(name)
                assert len(inside) == 1, inside  # never two at once
                await trio.sleep(0.01)
                inside.remove(name)
                if fail:
                    raise RuntimeError("boom")

    async with trio.open_nursery() as nursery:
        for n in range(4):
            nursery.start_soon(user, f"u{n}", n % 2 == 0)
    async with threads.held(slots):  # every slot came back
        pass



async def test_a_cancelled_caller_takes_no_slot():
    pool = trio.CapacityLimiter(1)
    with trio.CancelScope() as scope:
        scope.cancel()
        async with threads.held(pool):
            pytest.fail("a cancelled caller got in")
    assert scope.cancelled_caught and pool.borrowed_tokens == 0


async def test_held_says_whether_it_waited_for_its_slot():
    # image.read asks again whether its session is open only after such a wait.
    slots = trio.Semaphore(1)
    said = []

    async def user() -> None:
        async with threads.held(slots) as waited:
            said.append(waited)
            await trio.sleep(0)  # the other user comes while this one holds the slot

    async with trio.open_nursery() as nursery:
        nursery.start_soon(user)
        nursery.start_soon(user)
    assert said == [False, True]
