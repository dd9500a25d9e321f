"""The request table of a connection (daemon/requests.py), driven without a socket: who owns
each request's slot, what `cancel` finds, and that the slot comes back exactly once."""

from __future__ import annotations

import pytest

from toolsd.daemon.requests import RequestTable, State
from toolsd.wire.protocol import Request


class Table:
    """A RequestTable whose task starts and deliveries are recorded, not run."""

    def __init__(self, limit: int = 4):
        self.started = []
        self.delivered = []
        self.table = RequestTable(limit, start_task=self.started.append,
                                  deliver=lambda e, r: self.delivered.append((e, r)))

    def admit(self, request_id: int, method: str = "repl.exec"):
        return self.table.admit(Request(id=request_id, method=method))


def test_admission_stops_at_the_limit_and_a_released_slot_comes_back():
    t = Table(limit=2)
    first, second = t.admit(1), t.admit(2)
    assert first is not None and second is not None
    assert t.admit(3) is None
    t.table.answered(first)
    assert t.admit(3) is None  # answered is not written: the slot is still the write's
    t.table.release(first)
    assert t.admit(3) is not None


def test_a_repeated_id_and_a_cancel_are_not_registered_and_cancel_does_not_find_them():
    t = Table()
    first = t.admit(7)
    again = t.admit(7)
    cancel = t.admit(8, "cancel")
    assert first.registered and not again.registered and not cancel.registered
    assert again.scope is None and cancel.scope is None
    assert t.table.find(7) is first
    assert t.table.find(8) is None
    t.table.answered(again)  # the repeat's error answer does not unregister the first
    assert t.table.find(7) is first


def test_an_answered_request_is_no_longer_found():
    t = Table()
    entry = t.admit(1)
    t.table.answered(entry)
    assert t.table.find(1) is None


def test_finish_after_escalate_returns_false_and_the_task_has_the_request():
    t = Table()
    entry = t.admit(1)
    t.table.detach(entry)
    entry.escalate()
    assert t.started == [entry] and entry.state is State.TASK
    assert entry.finish({"late": True}) is False
    assert t.delivered == []


def test_escalate_after_finish_does_nothing():
    t = Table()
    entry = t.admit(1)
    t.table.detach(entry)
    ran = []
    entry.after(lambda: ran.append("after"))
    assert entry.finish({"ok": True}) is True
    assert t.delivered == [(entry, {"ok": True})] and ran == ["after"]
    assert entry.state is State.WRITING and t.table.find(1) is None
    entry.escalate()
    assert t.started == [] and entry.state is State.WRITING


def test_a_slot_is_released_once_only():
    t = Table()
    entry = t.admit(1)
    t.table.answered(entry)
    t.table.release(entry)
    with pytest.raises(AssertionError):
        t.table.release(entry)
    assert t.table.taken == 0


def test_a_request_cannot_be_released_before_it_is_answered():
    t = Table()
    entry = t.admit(1)
    with pytest.raises(AssertionError):
        t.table.release(entry)


def test_cancel_all_escalates_only_the_detached_requests():
    t = Table()
    in_task, detached, answered = t.admit(1), t.admit(2), t.admit(3)
    t.table.detach(detached)
    t.table.detach(answered)
    answered.finish({})
    t.table.cancel_all()
    assert t.started == [detached]
    assert in_task.state is State.TASK and detached.state is State.TASK


def test_undetach_gives_the_request_back_to_its_task_without_what_its_starter_gave():
    t = Table()
    entry = t.admit(1)
    t.table.detach(entry)
    entry.rest = lambda: None
    ran = []
    entry.after(lambda: ran.append("the starter's"))  # it undoes that itself when it declines
    t.table.undetach(entry)
    assert entry.state is State.TASK and entry.rest is None and t.started == []
    assert entry.finish({}) is False
    entry.run_after()
    assert ran == []


def test_work_after_the_answer_runs_once_and_a_failure_does_not_stop_the_rest(caplog):
    t = Table()
    entry = t.admit(1)
    ran = []
    entry.after(lambda: 1 / 0)
    entry.after(lambda: ran.append(1))
    entry.run_after()
    entry.run_after()
    assert ran == [1]
    assert "work after the answer to request 1 failed" in caplog.text
