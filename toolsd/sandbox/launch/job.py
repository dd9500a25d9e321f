"""One command spawned by the launcher: its state, its host pids, its exit, and the hold on its
shim."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import NamedTuple

import psutil
import trio

from toolsd.runtime.states import States
from toolsd.sandbox.errors import LauncherDied


class JobState(States):
    """Where a job is, as the launcher's messages (or its death) tell.

        SPAWNING -> RUNNING | FAILED | DONE | LOST
        RUNNING  -> EXITED | DONE | LOST
        EXITED   -> DONE
        LOST     -> EXITED | DONE
        FAILED, DONE: final

    SPAWNING -> DONE: the shim died between starting the command and saying so; the launcher
    ended the command and reports its end, without pids. LOST: the launcher died before the
    exit was reported. LOST -> EXITED | DONE: the report was still in the channel when the
    death was seen (unsandboxed, shims outlive their launcher): the exit is known after all.
    """

    SPAWNING = "spawning"
    RUNNING = "running"
    FAILED = "failed"
    EXITED = "exited"
    DONE = "done"
    LOST = "lost"


_MOVES = {
    JobState.SPAWNING: {JobState.RUNNING, JobState.FAILED, JobState.DONE, JobState.LOST},
    JobState.RUNNING: {JobState.EXITED, JobState.DONE, JobState.LOST},
    JobState.EXITED: {JobState.DONE},
    JobState.LOST: {JobState.EXITED, JobState.DONE},
    JobState.FAILED: set(),
    JobState.DONE: set(),
}
_EXITED = {JobState.EXITED, JobState.DONE, JobState.LOST}
_OVER = {JobState.DONE, JobState.LOST}


class Failure(NamedTuple):
    """Why the launcher could not start a job."""
    message: str
    limit: bool  # a resource limit of the session refused it
    unstarted: bool  # its shim died before starting it: it never ran, and may be sent again


class _Hold:
    """Resource handling: owns our end of the shim's hold pipe (see driver/launcher.py). While
    it is open the shim takes no other job, so everything below the shim is this job's tree.
    It is closed once the job is done and nobody holds the tree: `holding_tree()` blocks in
    use, and the caller's own hold of a `held` spawn until it lets go."""

    def __init__(self, held: bool):
        self.fd = -1
        self.count = int(held)
        self.caller_held = held

    def release_if_unused(self) -> None:
        if self.count == 0 and self.fd != -1:
            os.close(self.fd)
            self.fd = -1


class Job:
    """One command spawned by the launcher. pid / shim_pid are HOST pids (-1 if the process
    was already gone when its pid was read, which the hold pipe makes rare).

    The state (JobState) moves only in `_move`, which alone sets the events that waiters use:
    `answered` on leaving SPAWNING; `exited` on entering EXITED, DONE or LOST (the command
    exited, or the launcher died and nothing more will be reported: exit_code and signal stay
    None); `done` on entering DONE or LOST (the shim reaped every process of the tree and
    left, or the launcher died). `wait()` tells the two ends apart by raising LauncherDied.

    `abandoned` is not a state but whether anyone still wants the job: a spawn cancelled
    after its request went out abandons it, and the launcher kills it once it starts."""

    def __init__(self, job: int, argv: list[str], want_pid: bool = True, held: bool = False):
        self.job = job
        self.want_pid = want_pid
        self.argv = argv
        self.state = JobState.SPAWNING
        self.pid = -1
        self.shim_pid = -1
        self.exit_code: int | None = None
        self.signal: int | None = None
        self.failure: Failure | None = None
        self.terminal_fd = -1  # a "tty" spawn's master side: whoever spawned it closes it
        self.abandoned = False
        self.answered = trio.Event()
        self.exited = trio.Event()
        self.done = trio.Event()
        self._exit_scopes: list[trio.CancelScope] = []  # see cancel_on_exit
        self._started_at = 0.0
        self._hold = _Hold(held)

    def _move(self, to: JobState) -> None:
        assert to in _MOVES[self.state], f"job {self.job}: {self.state} -> {to}"
        if self.state is JobState.SPAWNING:
            self.answered.set()
        self.state = to
        if to in _EXITED:
            self.exited.set()
            scopes, self._exit_scopes = self._exit_scopes, []
            for scope in scopes:
                scope.cancel()
        if to in _OVER:
            self.done.set()
            self._hold.release_if_unused()

    @property
    def lost(self) -> bool:
        """The launcher died before this job's exit was reported."""
        return self.state is JobState.LOST

    @property
    def has_exited(self) -> bool:
        return self.exited.is_set()

    @property
    def started_at(self) -> float:
        """When the `started` message was read (time.time()); 0 before."""
        return self._started_at

    # ------------------------------------------------------------ what the launcher says

    def started(self, shim_pid: int, hold_fd: int, pid: int = -1) -> None:
        """The command runs: its shim's host pid, our end of the hold pipe (ours from now on),
        the command's host pid if it was asked for (`want_pid`)."""
        self.shim_pid = shim_pid
        self._started_at = time.time()
        self._hold.fd = hold_fd
        if self.want_pid:
            self.pid = pid
            # A byte tells the shim that we have read the command's host pid: it may reap the
            # command now. (A wakeup of the shim we spare jobs that do not need it.)
            try:
                os.write(hold_fd, b"!")
            except OSError:
                pass  # the shim is gone
        self._move(JobState.RUNNING)

    def failed(self, message: str, *, limit: bool = False, unstarted: bool = False) -> None:
        self.failure = Failure(message, limit, unstarted)
        self._move(JobState.FAILED)

    def ended(self, code: int | None, signal: int | None, *, done: bool) -> None:
        """The command's exit (with `done` when nothing of its tree is left). Before `started`,
        the shim died and the launcher ended the command: the job is done. A second report
        (a dead shim's, after its own) changes nothing known but that the job is done."""
        if self.state in (JobState.SPAWNING, JobState.RUNNING, JobState.LOST):
            self.exit_code, self.signal = code, signal
            spawning = self.state is JobState.SPAWNING
            self._move(JobState.DONE if done or spawning else JobState.EXITED)
        elif self.state is JobState.EXITED and done:
            self._move(JobState.DONE)

    def finished(self) -> None:
        """Nothing of the command's tree is left. (After the launcher's death the job stays
        lost: its exit was never reported.)"""
        if self.state in (JobState.RUNNING, JobState.EXITED):
            self._move(JobState.DONE)

    def launcher_died(self) -> None:
        """Nothing more will be reported about this job."""
        if self.state in (JobState.SPAWNING, JobState.RUNNING):
            self._move(JobState.LOST)
        elif self.state is JobState.EXITED:
            self._move(JobState.DONE)

    # ------------------------------------------------------------ what its users do

    def abandon(self) -> None:
        """Nobody wants the job any more (and nobody will let it go later)."""
        self.abandoned = True
        self.let_go()
        self.close_terminal()

    def cancel_on_exit(self, scope: trio.CancelScope) -> None:
        """Cancel `scope` once the command has exited (at once if it has): a task can read
        the command's output in it and be woken by the exit, with no task of its own waiting
        for the exit (a task is a pass of the scheduler more). Cancelling a scope that has
        ended does nothing."""
        if self.exited.is_set():
            scope.cancel()
        else:
            self._exit_scopes.append(scope)

    def close_terminal(self) -> None:
        if self.terminal_fd != -1:
            os.close(self.terminal_fd)
            self.terminal_fd = -1

    async def wait(self) -> tuple[int | None, int | None]:
        """(exit_code, signal) once the command has exited; LauncherDied if it never will be
        reported."""
        await self.exited.wait()
        if self.state is JobState.LOST:
            raise LauncherDied(f"the sandbox launcher died before {self.argv[0]!r} exited; "
                               f"close the session and open a new one")
        return self.exit_code, self.signal

    async def wait_answered(self, stall_s: float, on_stall, deadline: float) -> None:
        """Until the launcher has answered the spawn (`answered`), awaiting `on_stall()` each
        time `stall_s` passes without an answer; trio.TooSlowError at `deadline` (trio's
        clock). One cancel scope a wait, whose deadline is the nearer of the two: a
        scope is a good part of a spawn's Python."""
        while True:
            with trio.CancelScope(deadline=min(trio.current_time() + stall_s, deadline)):
                await self.answered.wait()
            if self.answered.is_set():
                return
            if trio.current_time() >= deadline:
                raise trio.TooSlowError
            await on_stall()

    @contextlib.contextmanager
    def holding_tree(self) -> Iterator[int | None]:
        """The host pid of the shim at the top of this job's tree, every process below it
        being the job's, or None once there is no such tree any more (the job is done and its
        shim released for another job, or the shim died). Use the pid only inside the `with`:
        the shim is not released meanwhile."""
        self._hold.count += 1
        try:
            yield self._tree_root()
        finally:
            self._hold.count -= 1
            self._release_if_done()

    @property
    def tree_gone(self) -> bool:
        """No tree to hold: not started yet, or done and its shim released for good.
        holding_tree() would give None, and a caller that only looks may skip it."""
        return self._hold.fd == -1 or self.shim_pid <= 0

    def _tree_root(self) -> int | None:
        if self.tree_gone:
            return None
        try:
            # A shim killed by its own command leaves a pid that anyone's new process may
            # take: ours was created before the job started.
            if psutil.Process(self.shim_pid).create_time() <= self._started_at + 0.05:
                return self.shim_pid
        except psutil.Error:
            pass
        return None

    def let_go(self) -> None:
        """End the hold that a `held` spawn gave its caller; idempotent."""
        if self._hold.caller_held:
            self._hold.caller_held = False
            self._hold.count -= 1
            self._release_if_done()

    def _release_if_done(self) -> None:
        """Let the shim take another job, once this one is done and nobody holds its tree.
        (`done`, not the state: a late report after the launcher's death moves LOST back to
        EXITED, and nothing will say `done` then.)"""
        if self.done.is_set():
            self._hold.release_if_unused()

    def __repr__(self) -> str:
        return (f"<Job {self.job} {self.state.value} pid={self.pid} shim={self.shim_pid} "
                f"argv={self.argv!r}>")
