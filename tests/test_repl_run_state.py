"""A repl.exec's states (tools/repl_run.py's RunState), driven without an interpreter: the
REPL's lock is given back once, on entering ANSWERED, whichever way the request ends."""

from __future__ import annotations

import pytest
import trio

from toolsd.tools.repl_run import Run, RunState
from toolsd.wire.protocol import ReplExecParams


class FakeRepl:
    """What a Run asks of its Repl: its late output, its verdict, and the lock's return."""

    spills = None
    cut_off = False

    def __init__(self):
        self.ended = []
        self.lock = trio.Semaphore(1)
        self.lock.acquire_nowait()

    def take_late(self, feed):
        return 0

    def end_run(self, run):
        assert run.state is RunState.ANSWERED
        self.ended.append(run)
        self.lock.release()

    async def carry_out(self, run):
        return "ok", False, "", 0


class FakeInterp:
    waiter = None
    sentinel = None
    loss_told = False


class FakeSession:
    """What a run without a task reports through (SessionView): nothing to report."""

    class repositories:
        @staticmethod
        def look_now():
            return []

    @staticmethod
    def reported_as(result, host_exec):
        return result


class FakeDetached:
    def __init__(self, takes: bool):
        self.takes = takes  # finish() succeeds (no task has the request yet)
        self.finished = []
        self.escalated = 0

    def finish(self, result):
        if self.takes:
            self.finished.append(result)
        return self.takes

    def escalate(self):
        self.escalated += 1


def make_run() -> tuple[Run, FakeRepl]:
    repl = FakeRepl()
    run = Run(repl, FakeInterp(), ReplExecParams(session="s", turn="t", code="1"), False, 0.0)
    run.session = FakeSession()
    return run, repl


async def test_a_run_with_a_task_gives_the_lock_back_once_it_is_answered():
    run, repl = make_run()
    assert run.state is RunState.BEGUN
    result = await run.finish()
    assert result.status == "ok"
    assert run.state is RunState.ANSWERED and repl.ended == [run] and repl.lock.value == 1


async def test_a_run_whose_task_fails_still_gives_the_lock_back():
    run, repl = make_run()

    async def broken(run):
        raise RuntimeError("the interpreter's pipe broke")

    repl.carry_out = broken
    with pytest.raises(RuntimeError):
        await run.finish()
    assert run.state is RunState.ANSWERED and repl.lock.value == 1


async def test_a_detached_run_answered_on_its_sentinel_gives_the_lock_back():
    run, repl = make_run()
    detached = FakeDetached(takes=True)
    run.detach(detached)
    assert run.state is RunState.DETACHED and repl.ended == []
    run.sentinel_came(True)
    assert [r.status for r in detached.finished] == ["ok"]
    assert run.state is RunState.ANSWERED and repl.lock.value == 1


async def test_a_sentinel_after_the_request_went_to_a_task_leaves_it_to_that_task():
    run, repl = make_run()
    run.detach(FakeDetached(takes=False))  # escalated by a cancel meanwhile
    run.sentinel_came(True)
    assert run.state is RunState.DETACHED and repl.ended == []
    await run.finish()
    assert run.state is RunState.ANSWERED and repl.ended == [run]


async def test_a_detached_run_that_needs_a_task_is_answered_by_that_task():
    run, repl = make_run()
    detached = FakeDetached(takes=True)
    run.detach(detached)
    run.needs_task()
    assert detached.escalated == 1 and run.state is RunState.DETACHED
    await run.finish()
    assert run.state is RunState.ANSWERED and repl.ended == [run]


async def test_a_run_is_answered_once_only():
    run, repl = make_run()
    await run.finish()
    with pytest.raises(AssertionError):
        await run.finish()
    assert repl.ended == [run]
