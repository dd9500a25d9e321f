"""An Interpreter's two states, Sending and Life, moved through its own methods on pipes of
this process, without a driver or a launcher."""

import fcntl
import os

import pytest
import trio
import trio.testing

from toolsd.sandbox.launch.job import Job
from toolsd.tools.interpreter import Interpreter, Life, Sending


class Pipes:
    """The command and interrupt pipes, our ends as the Interpreter's; the driver's ends here."""

    def __init__(self):
        self.cmd_r, cmd_w = os.pipe2(os.O_CLOEXEC)
        self.intr_r, intr_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        os.set_blocking(cmd_w, False)
        self.size = fcntl.fcntl(cmd_w, fcntl.F_GETPIPE_SZ)
        self.job = Job(1, ["python3"], want_pid=False)
        self.job.started(shim_pid=-1, hold_fd=-1)
        self.interp = Interpreter(self.job, cmd_w, intr_w, lambda data: None)

    def read_commands(self) -> bytes:
        os.set_blocking(self.cmd_r, False)
        out = b""
        try:
            while chunk := os.read(self.cmd_r, 1 << 16):
                out += chunk
        except BlockingIOError:
            pass
        return out

    def close(self):
        for fd in (self.cmd_r, self.intr_r, self.interp._cmd_fd, self.interp._intr_fd):
            if fd >= 0:
                os.close(fd)


@pytest.fixture
def pipes():
    p = Pipes()
    yield p
    p.close()


def test_a_fresh_interpreter_has_nothing_to_send_and_runs(pipes):
    assert (pipes.interp.sent, pipes.interp.life) == (Sending.ALL, Life.RUNNING)
    assert not pipes.interp.gone


def test_a_request_the_pipe_takes_at_once_is_numbered(pipes):
    pipes.interp.begin(b"1+1\n", lambda data: None)
    assert pipes.interp.sent is Sending.ALL and pipes.interp.seq == 1
    assert pipes.read_commands() == b"1+1\n"


async def test_a_request_bigger_than_the_pipe_is_sent_in_parts(pipes):
    line = b"x" * (pipes.size * 2) + b"\n"
    pipes.interp.begin(line, lambda data: None)
    assert pipes.interp.sent is Sending.SOME and pipes.interp.seq == 0  # not numbered yet
    received = pipes.read_commands()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipes.interp.send_rest)
        while len(received) < len(line):
            await trio.testing.wait_all_tasks_blocked()
            received += pipes.read_commands()
    assert received == line
    assert pipes.interp.sent is Sending.ALL and pipes.interp.seq == 1


def test_a_request_that_found_the_pipe_full_sent_nothing(pipes):
    os.write(pipes.interp._cmd_fd, b"y" * pipes.size)  # a driver that reads nothing
    pipes.interp.begin(b"1\n", lambda data: None)
    assert pipes.interp.sent is Sending.NONE and pipes.interp.seq == 0
    # Cancelled before its first byte went out: the next request begins afresh.
    pipes.read_commands()
    pipes.interp.begin(b"2\n", lambda data: None)
    assert pipes.interp.sent is Sending.ALL and pipes.interp.seq == 1
    assert pipes.read_commands() == b"2\n"


def test_its_exit_makes_it_gone_at_once(pipes):
    # Read from the Job, not copied by the watch task: start_detached must see it now.
    pipes.job.ended(0, None, done=False)
    assert pipes.interp.life is Life.RUNNING and pipes.interp.gone


async def test_its_output_closing_makes_it_gone(pipes):
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipes.interp._pump, out_r)
        await trio.testing.wait_all_tasks_blocked()
        assert not pipes.interp.gone
        os.close(out_w)
    assert pipes.interp.life is Life.OUTPUT_CLOSED and pipes.interp.gone
    assert pipes.interp.eof.is_set()


@pytest.mark.parametrize("output_closed_first", [False, True])
async def test_a_kill_moves_to_killing_then_killed(pipes, output_closed_first):
    pipes.job.ended(None, 9, done=True)  # nothing left of its tree to end
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    lives = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipes.interp._pump, out_r)
        if output_closed_first:
            os.close(out_w)
            await trio.testing.wait_all_tasks_blocked()
            assert pipes.interp.life is Life.OUTPUT_CLOSED

        async def watch():
            await trio.testing.wait_all_tasks_blocked()
            lives.append((pipes.interp.life, pipes.interp.gone))
            if not output_closed_first:
                os.close(out_w)  # the tree's end closes the output: an EOF, not a move

        nursery.start_soon(watch)
        assert await pipes.interp.kill() == 0
    if not output_closed_first:  # else nothing in the kill waits: no task sees KILLING
        assert lives == [(Life.KILLING, True)]
    assert pipes.interp.life is Life.KILLED and pipes.interp.eof.is_set()
    assert await pipes.interp.kill() == 0  # idempotent
    assert pipes.interp.life is Life.KILLED
