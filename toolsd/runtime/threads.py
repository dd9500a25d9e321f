"""Worker-thread pools: one trio.CapacityLimiter per kind of blocking work, so that a slow kind
(a stop holding its thread for its grace period, a costly `until` search) never starves the
others of threads; `held` takes a slot of one with no needless pass of the scheduler."""

from __future__ import annotations

from typing import Protocol

import trio

_VARS: dict[str, trio.lowlevel.RunVar] = {}


def limiter(name: str, slots: int) -> trio.CapacityLimiter:
    """The pool for `name` in this trio run (a RunVar, not a module global: a
    CapacityLimiter belongs to one run)."""
    var = _VARS.setdefault(name, trio.lowlevel.RunVar(f"toolsd_{name}_threads"))
    try:
        return var.get()
    except LookupError:
        pool = trio.CapacityLimiter(slots)
        var.set(pool)
        return pool


class _Slots(Protocol):
    def acquire_nowait(self) -> None: ...
    async def acquire(self) -> None: ...
    def release(self) -> None: ...


class held:
    """`async with held(slots)`: `async with slots` (a CapacityLimiter, Semaphore or Lock),
    without the pass through trio's scheduler that its `acquire` makes even when a slot is
    free: on a short call that pass costs more than the work. It waits only when none is
    free; a caller already cancelled is stopped here all the same, before it takes a slot.
    `async with held(slots) as waited`: whether it waited (others ran meanwhile). A plain
    class rather than an async generator, whose hooks and frames cost more than taking a
    free slot."""

    __slots__ = ("_slots",)

    def __init__(self, slots: _Slots):
        self._slots = slots

    async def __aenter__(self) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            await self._slots.acquire()
            return True
        return False

    async def __aexit__(self, *exc_info: object) -> None:
        self._slots.release()
