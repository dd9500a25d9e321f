"""A starting REPL interpreter's CPU priority: lowered while it starts, given back after.

A start (an interpreter's own, its site imports, the driver's) is tens of milliseconds of
CPU, and even one at a time (Host.interpreter_starts) the scheduler gives it the share of
any runnable process: under a burst of starts (a thousand turns beginning at once) the
calls of the sessions already running wait behind them. Lowered, a start takes the CPU the
calls leave; it gets its priority back as soon as it has answered its warm-up, or half its
slot has gone by (a start the calls leave no CPU for still ends within its slot), and
always before the first request's code reaches it.

Only where the daemon can give the priority back: lowering a process's priority needs no
privilege, raising it again needs CAP_SYS_NICE or an RLIMIT_NICE that allows it, and an
interpreter must never stay lowered for its turn. Whether it can is tried once at start,
on a thread of the daemon's own (what the kernel checks is the same: the caller's
capability, the target's RLIMIT_NICE, which a sandbox's processes inherit from the daemon).
Elsewhere starts run at the daemon's priority, as before.

Set on the interpreter's process group (its shim starts it with setsid), so what it forks
while it starts goes with it. The interpreter's first instructions run at the daemon's
priority: it is lowered when the daemon hears its pid.

Where the kernel groups processes by session for the scheduler (autogroups,
/proc/sys/kernel/sched_autogroup_enabled), a process's nice value weighs only against the
processes of its own session, and the setsid that gives the interpreter its process group
gives it an autogroup of its own too: lowered by its nice value alone it would still take a
whole group's share beside the daemon's. There the start's autogroup is lowered as well
(/proc/PID/autogroup), where the daemon can give that back at once: the kernel lets a
process without CAP_SYS_ADMIN change an autogroup's nice value only once in a tenth of a
second, machine-wide, so the daemon tries two changes in a row once, at start.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Awaitable, Callable

import trio

log = logging.getLogger("toolsd.repl")

# The lowest priority there is: the scheduler then gives a start a sliver of a core beside
# each runnable call, and what the calls leave idle.
STARTING_NICE = 19
# A start runs lowered for at most this long: half its slot (interpreter.py's START_SLOT_S),
# so that one the calls leave no CPU for still has the other half to end in at its own.
LOWERED_S = 1.0


@dataclasses.dataclass(frozen=True)
class StartPriority:
    """`normal`: the daemon's own nice value, which a sandbox's processes inherit. `lowers`:
    whether starts run at STARTING_NICE (see the module's docstring). `autogroups`: whether
    their autogroups are lowered too."""

    normal: int
    lowers: bool
    autogroups: bool = False

    @classmethod
    def find(cls) -> StartPriority:
        normal = os.getpriority(os.PRIO_PROCESS, 0)
        if normal >= STARTING_NICE:
            return cls(normal, False)  # as low as a start would be
        lowers = _can_restore(normal)
        if not lowers:
            log.info("REPL interpreters start at the daemon's priority: it could not raise a "
                     "lowered one's again (no CAP_SYS_NICE, and RLIMIT_NICE too low)")
            return cls(normal, False)
        autogroups = _autogroups_on()
        if autogroups and not _can_restore_autogroup():
            log.info("REPL interpreters start at the daemon's priority beside other sessions: "
                     "the kernel groups processes by session, and the daemon cannot change "
                     "a group's priority twice in a row (no CAP_SYS_ADMIN)")
            return cls(normal, False)
        return cls(normal, True, autogroups)

    async def while_starting(self, pid: int, started: Callable[[], Awaitable[None]]) -> None:
        """Await `started()`, the process group of `pid` (a host pid, its leader) lowered
        for the first LOWERED_S of it."""
        if not self.lowers or pid <= 0:
            await started()
            return
        _set(pid, STARTING_NICE)
        if self.autogroups:
            _set_autogroup(pid, STARTING_NICE)
        given_back: list[bool] = []  # by the timer, after LOWERED_S
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._give_back_after, pid, LOWERED_S, given_back)
                await started()
                nursery.cancel_scope.cancel()
        finally:
            if not given_back:
                self._give_back(pid)

    async def _give_back_after(self, pid: int, seconds: float, given_back: list[bool]) -> None:
        await trio.sleep(seconds)
        self._give_back(pid)
        given_back.append(True)

    def _give_back(self, pid: int) -> None:
        # A fresh autogroup's nice value is 0, whatever the daemon's own.
        if not _set(pid, self.normal) or (self.autogroups and not _set_autogroup(pid, 0)):
            log.warning("the interpreter %d may run at a lowered priority: it could not be "
                        "raised again", pid)


def _set(pgid: int, nice: int) -> bool:
    """False if the group is there and kept its priority."""
    try:
        os.setpriority(os.PRIO_PGRP, pgid, nice)
    except ProcessLookupError:
        pass  # it ended: nothing runs lowered
    except OSError:
        return False
    return True


def _can_restore(normal: int) -> bool:
    """Whether the daemon can lower a thread and raise it again to `normal`: tried on a
    thread of its own, which ends with the priority it was left at."""
    raised: list[bool] = []

    def attempt() -> None:
        me = threading.get_native_id()
        try:
            os.setpriority(os.PRIO_PROCESS, me, normal + 1)
            os.setpriority(os.PRIO_PROCESS, me, normal)
        except OSError:
            raised.append(False)
        else:
            raised.append(True)

    thread = threading.Thread(target=attempt, name="toolsd-priority-check")
    thread.start()
    thread.join()
    return raised == [True]


def _set_autogroup(pid: int, nice: int) -> bool:
    """The nice value of the autogroup `pid` leads; False if it is there and kept its own."""
    try:
        fd = os.open(f"/proc/{pid}/autogroup", os.O_WRONLY)
    except FileNotFoundError:
        return True  # it ended: nothing runs lowered
    except OSError:
        return False
    try:
        os.write(fd, b"%d" % nice)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _autogroups_on() -> bool:
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled", "rb") as f:
            return f.read().strip() == b"1"
    except OSError:
        return False  # a kernel without them


def _can_restore_autogroup() -> bool:
    """Whether the daemon may change an autogroup's nice value twice in a row (what a start
    needs: lowered, then given back within the tenth of a second the kernel otherwise makes
    it wait): its own group's value written back twice, which changes nothing."""
    try:
        with open("/proc/self/autogroup", "rb") as f:
            own = int(f.read().rsplit(b" ", 1)[1])
    except (OSError, ValueError, IndexError):
        return False
    return _set_autogroup(os.getpid(), own) and _set_autogroup(os.getpid(), own)
