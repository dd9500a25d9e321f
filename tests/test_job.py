"""A Job's states, driven the way the launcher's messages drive them, without a launcher: the
events its waiters use, what wait() says, and when the shim's hold pipe is let go."""

import os

import pytest
import trio
import trio.testing

from toolsd.sandbox.errors import LauncherDied
from toolsd.sandbox.launch.job import Job, JobState


class HoldPipe:
    """A pipe whose write end plays the job's end of the shim's hold pipe."""

    def __init__(self):
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)

    def read(self) -> bytes | None:
        """What the job wrote; b"" once it closed its end; None if it is still open."""
        try:
            return os.read(self.r, 64)
        except BlockingIOError:
            return None

    def closed(self) -> bool:
        data = self.read()
        while data:
            data = self.read()
        return data == b""

    def close(self):
        if not self.closed():
            os.close(self.w)
        os.close(self.r)


@pytest.fixture
def hold():
    pipe = HoldPipe()
    yield pipe
    pipe.close()


def events(job: Job) -> tuple[bool, bool, bool]:
    return job.answered.is_set(), job.exited.is_set(), job.done.is_set()


async def test_a_command_that_runs_exits_and_is_done(hold):
    job = Job(1, ["sh"])
    assert job.state is JobState.SPAWNING and events(job) == (False, False, False)
    job.started(shim_pid=100, hold_fd=hold.w, pid=101)
    assert job.state is JobState.RUNNING and events(job) == (True, False, False)
    assert (job.pid, job.shim_pid) == (101, 100) and job.started_at > 0
    assert hold.read() == b"!"  # the shim may reap the command: we have its pid
    job.ended(0, None, done=False)
    assert job.state is JobState.EXITED and events(job) == (True, True, False)
    assert await job.wait() == (0, None)
    assert not hold.closed()  # the tree may still have processes: the shim stays ours
    job.finished()
    assert job.state is JobState.DONE and events(job) == (True, True, True)
    assert hold.closed()


async def test_one_message_for_the_exit_and_the_end_of_the_tree(hold):
    job = Job(1, ["sh"], want_pid=False)
    job.started(shim_pid=100, hold_fd=hold.w, pid=101)
    assert job.pid == -1 and hold.read() is None  # no pid asked: no wakeup of the shim
    job.ended(None, 9, done=True)
    assert job.state is JobState.DONE and events(job) == (True, True, True)
    assert await job.wait() == (None, 9)
    assert hold.closed()


async def test_a_shim_that_died_before_saying_started():
    job = Job(1, ["sh"])
    job.ended(None, 9, done=False)
    assert job.state is JobState.DONE and events(job) == (True, True, True)
    assert (job.pid, job.shim_pid) == (-1, -1)
    assert await job.wait() == (None, 9)


def test_a_failed_start_is_an_answer_and_nothing_else():
    job = Job(1, ["nope"])
    job.failed("no such program", limit=True, unstarted=False)
    assert job.state is JobState.FAILED and events(job) == (True, False, False)
    assert job.failure == ("no such program", True, False)


@pytest.mark.parametrize("started", [False, True])
async def test_the_launcher_dying_before_the_exit_loses_the_job(hold, started):
    job = Job(1, ["sleep"])
    if started:
        job.started(shim_pid=100, hold_fd=hold.w, pid=101)
    job.launcher_died()
    assert job.state is JobState.LOST and job.lost and events(job) == (True, True, True)
    with pytest.raises(LauncherDied, match="close the session"):
        await job.wait()
    if started:
        assert hold.closed()


async def test_the_launcher_dying_after_the_exit_only_ends_the_job(hold):
    job = Job(1, ["sh"])
    job.started(shim_pid=100, hold_fd=hold.w, pid=101)
    job.ended(3, None, done=False)
    job.launcher_died()
    assert job.state is JobState.DONE and not job.lost and events(job) == (True, True, True)
    assert await job.wait() == (3, None)
    assert hold.closed()


async def test_an_exit_read_after_the_death_was_seen_still_counts(hold):
    # Unsandboxed, a shim outlives its launcher and its report may still be in the channel.
    job = Job(1, ["sh"])
    job.started(shim_pid=100, hold_fd=hold.w, pid=101)
    job.launcher_died()
    job.ended(0, None, done=False)
    assert job.state is JobState.EXITED and not job.lost
    assert await job.wait() == (0, None)
    assert hold.closed()  # let go at the death: nothing more will say done


def test_done_after_the_death_leaves_the_job_lost():
    job = Job(1, ["sh"])
    job.started(shim_pid=100, hold_fd=-1, pid=101)
    job.launcher_died()
    job.finished()
    assert job.state is JobState.LOST


def test_a_second_exit_report_keeps_the_first_exit(hold):
    # A shim that reported its command's exit and then died: the launcher reports the job
    # as done with an exit of its own guessing.
    job = Job(1, ["sh"])
    job.started(shim_pid=100, hold_fd=hold.w, pid=101)
    job.ended(0, None, done=False)
    job.ended(None, 9, done=True)
    assert job.state is JobState.DONE and (job.exit_code, job.signal) == (0, None)


def test_a_held_job_keeps_its_shim_until_let_go(hold):
    job = Job(1, ["sh"], held=True)
    job.started(shim_pid=100, hold_fd=hold.w, pid=101)
    job.ended(0, None, done=True)
    assert not hold.closed()  # the caller answers first, and wakes the shim after
    job.let_go()
    assert hold.closed()
    job.let_go()  # idempotent


def test_holding_the_tree_keeps_the_shim_until_the_block_ends(hold):
    job = Job(1, ["sh"])
    job.started(shim_pid=os.getpid(), hold_fd=hold.w, pid=101)
    with job.holding_tree() as root:
        assert root == os.getpid()  # older than the job: a shim, not a reused pid
        job.ended(0, None, done=True)
        assert not hold.closed()
    assert hold.closed()
    with job.holding_tree() as root:
        assert root is None  # the shim is released: no tree of ours any more


def test_an_abandoned_held_job_lets_go(hold):
    job = Job(1, ["sh"], held=True)
    job.abandon()
    assert job.abandoned
    job.started(shim_pid=100, hold_fd=hold.w, pid=101)
    job.ended(None, 9, done=True)
    assert hold.closed()


@pytest.mark.parametrize("final", ["failed", "done"])
def test_a_finished_job_does_not_move_again(final):
    job = Job(1, ["sh"])
    if final == "failed":
        job.failed("x")
    else:
        job.ended(0, None, done=True)
    before = job.state
    job.launcher_died()
    job.finished()
    assert job.state is before
    with pytest.raises(AssertionError):
        job.started(shim_pid=1, hold_fd=-1)


async def test_waiters_wake_on_the_move():
    job = Job(1, ["sh"], want_pid=False)
    async with trio.open_nursery() as nursery:
        woken = []

        async def waiter(name, event):
            await event.wait()
            woken.append(name)

        for name in ("answered", "exited", "done"):
            nursery.start_soon(waiter, name, getattr(job, name))
        await trio.testing.wait_all_tasks_blocked()
        job.started(shim_pid=1, hold_fd=-1)
        await trio.testing.wait_all_tasks_blocked()
        assert woken == ["answered"]
        job.ended(0, None, done=False)
        await trio.testing.wait_all_tasks_blocked()
        assert woken == ["answered", "exited"]
        job.finished()
    assert woken == ["answered", "exited", "done"]


async def test_the_exit_cancels_a_scope_waiting_on_the_output(hold):
    # shell.run reads a command's output in its own task, and the exit ends that read.
    job = Job(1, ["sh"], want_pid=False)
    job.started(shim_pid=100, hold_fd=hold.w)
    reading = trio.CancelScope()
    job.cancel_on_exit(reading)
    assert not reading.cancel_called
    job.ended(0, None, done=False)
    assert reading.cancel_called
    late = trio.CancelScope()  # asked after the exit: cancelled at once
    job.cancel_on_exit(late)
    assert late.cancel_called


async def test_a_launcher_death_cancels_the_scope_too():
    job = Job(1, ["sh"])
    reading = trio.CancelScope()
    job.cancel_on_exit(reading)
    job.launcher_died()
    assert reading.cancel_called and job.lost


async def test_a_spawn_waits_for_its_answer_resuming_stalls_until_its_deadline(autojump_clock):
    # Launcher.spawn's one wait: on_stall each stall_s without an answer (the launcher
    # resumes stopped spawns then), and the launcher is stuck at the deadline. (trio's
    # clock jumps: nothing here waits for real time.)
    job = Job(1, ["sh"])
    stalls = []

    async def on_stall():
        stalls.append(trio.current_time())

    with pytest.raises(trio.TooSlowError):
        await job.wait_answered(1, on_stall, trio.current_time() + 3.5)
    assert len(stalls) == 3 and not job.answered.is_set()

    async def answer_on_first_stall():
        job.failed("no such program")

    await job.wait_answered(1, answer_on_first_stall, trio.current_time() + 60)
    assert job.state is JobState.FAILED
