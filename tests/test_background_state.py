"""A BackgroundProcess's states, moved by its own task on a pipe of this process and a Job
moved by hand: no launcher, no sandbox, no command."""

import os
import types

import pytest
import trio
import trio.testing

from toolsd.sandbox.launch.job import Job
from toolsd.tools.background_process import BackgroundProcess, ProcessState
from toolsd.tools.capped_log import CappedLog


class Setup:
    def __init__(self, folder):
        self.job = Job(1, ["sh"], want_pid=False)
        self.job.started(shim_pid=-1, hold_fd=-1)
        self.session = types.SimpleNamespace(id="s1", processes={},
                                             memory_note=lambda before: None)
        self.log_path = os.path.join(folder, "bg1.log")
        self.proc = BackgroundProcess("bg1", self.session, "sh -c x", "x", self.job,
                                      CappedLog(self.log_path, 1 << 20))
        self.session.processes["bg1"] = self.proc
        self.read_fd, self.write_fd = os.pipe2(os.O_CLOEXEC)

    def close_output(self):
        if self.write_fd != -1:
            os.close(self.write_fd)
            self.write_fd = -1


@pytest.fixture
def setup(tmp_path):
    s = Setup(str(tmp_path))
    yield s
    s.close_output()


async def test_a_process_lives_through_every_state_in_order(setup):
    proc = setup.proc
    seen = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(proc.watch, setup.read_fd)
        await trio.testing.wait_all_tasks_blocked()
        seen.append((proc.state, proc.status, proc.finished.is_set()))
        os.write(setup.write_fd, b"hello\n")
        setup.close_output()  # EOF before the exit: output_done, still running
        await trio.testing.wait_all_tasks_blocked()
        seen.append((proc.state, proc.status, proc.output_done.is_set()))
        setup.job.ended(0, None, done=True)
        # The status reads the Job: "exited" before the task has seen the exit.
        seen.append((proc.state, proc.status, proc.ended_at))
        await trio.testing.wait_all_tasks_blocked()
        seen.append((proc.state, proc.finished.is_set(), proc.retired, proc.log is not None))
        assert os.path.exists(setup.log_path)
        assert proc.read(0, 100)[0] == b"hello\n"
        proc.forget()
    assert seen == [
        (ProcessState.RUNNING, "running", False),
        (ProcessState.RUNNING, "running", True),
        (ProcessState.RUNNING, "exited", None),
        (ProcessState.RETIRED, True, True, True),  # sealed, still readable
    ]
    assert proc.state is ProcessState.FORGOTTEN and proc.ended_at is not None
    assert proc.log is None and not os.path.exists(setup.log_path)


async def test_its_exit_then_its_last_output(setup):
    proc = setup.proc
    async with trio.open_nursery() as nursery:
        nursery.start_soon(proc.watch, setup.read_fd)
        await trio.testing.wait_all_tasks_blocked()
        setup.job.ended(3, None, done=False)
        await trio.testing.wait_all_tasks_blocked()
        # The pipe is still open (a child may hold it): the exit is seen, output may come.
        assert proc.state is ProcessState.EXITED and proc.ended_at is not None
        assert not proc.finished.is_set()
        setup.close_output()
        await trio.testing.wait_all_tasks_blocked()
        assert proc.state is ProcessState.RETIRED and proc.finished.is_set()
        proc.forget()


async def test_a_cancelled_task_retires_whatever_the_state(setup):
    # The session closed: its nursery cancels the task while the process runs.
    proc = setup.proc
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(proc.watch, setup.read_fd)
            await trio.testing.wait_all_tasks_blocked()
            scope.cancel()
    assert proc.state is ProcessState.RETIRED
    assert proc.finished.is_set() and proc.output_done.is_set() and proc.ended_at is not None
    assert proc.log is None and not os.path.exists(setup.log_path)
    assert proc.status == "running"  # the Job's word: nothing said it exited


async def test_a_stop_that_sees_the_exit_sets_the_end_once(setup):
    proc = setup.proc
    async with trio.open_nursery() as nursery:
        nursery.start_soon(proc.watch, setup.read_fd)
        await trio.testing.wait_all_tasks_blocked()
        setup.job.ended(None, 15, done=True)
        setup.close_output()
        result = await proc.stop(0)
        ended_at = proc.ended_at
        await trio.testing.wait_all_tasks_blocked()
        assert result.status == "exited" and ended_at is not None
        assert proc.ended_at == ended_at  # the task's own sight of the exit keeps it
        proc.forget()


def test_only_a_retired_process_is_forgotten(setup):
    os.close(setup.read_fd)  # no task here to read it
    with pytest.raises(AssertionError):
        setup.proc.forget()
    assert setup.proc.state is ProcessState.RUNNING
    setup.proc._retire()
    setup.proc.forget()
    assert setup.proc.state is ProcessState.FORGOTTEN
