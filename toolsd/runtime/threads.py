"""Worker-thread pools: one trio.CapacityLimiter per kind of blocking work, so that a slow kind
(a stop holding its thread for its grace period, a costly `until` search) never starves the
others of threads."""

from __future__ import annotations

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
