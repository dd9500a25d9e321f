"""One command spawned by the launcher: its host pids, its exit, and the hold on its shim."""

from __future__ import annotations

import contextlib
import os

import psutil
import trio

from toolsd.sandbox.errors import LauncherDied


class Job:
    """One command spawned by the launcher. pid / shim_pid are HOST pids (-1 if the process
    was already gone when its pid was read, which the hold pipe makes rare).

    `exited` is set when the command exits, and also when the launcher dies (nothing more will
    be reported then: exit_code and signal stay None and `lost` is True); `done` when the shim
    has reaped every process of the tree and left, or the launcher died. `wait()` tells the
    two apart by raising LauncherDied."""

    def __init__(self, job: int, argv: list[str], want_pid: bool = True, held: bool = False):
        self.job = job
        self.want_pid = want_pid
        self.argv = argv
        self.pid = -1
        self.shim_pid = -1
        self.exit_code: int | None = None
        self.signal: int | None = None
        self.lost = False
        self.exited = trio.Event()
        self.done = trio.Event()
        self._reported = False  # exited came from the shim, not from the launcher's death
        self._answered = trio.Event()  # started, error, or death
        self._error: str | None = None
        self._error_limit = False  # the error was a resource limit's
        self._unstarted = False  # the error was its shim's death before running it
        self._abandoned = False  # the spawn call was cancelled: kill it when it starts
        self._started_at = 0.0
        # Our end of the shim's hold pipe (see driver/launcher.py): while it is open the shim
        # takes no other job, so everything below it is this job's tree.
        self._hold_fd = -1
        self._holds = int(held)  # holding_tree() blocks in use, and the caller's hold
        self._held = held

    async def wait(self) -> tuple[int | None, int | None]:
        """(exit_code, signal) once the command has exited; LauncherDied if it never will be
        reported."""
        await self.exited.wait()
        if not self._reported:
            raise LauncherDied(f"the sandbox launcher died before {self.argv[0]!r} exited; "
                               f"close the session and open a new one")
        return self.exit_code, self.signal

    @contextlib.contextmanager
    def holding_tree(self):
        """The host pid of the shim at the top of this job's tree, every process below it
        being the job's, or None once there is no such tree any more (the job is done and its
        shim released for another job, or the shim died). Use the pid only inside the `with`:
        the shim is not released meanwhile."""
        self._holds += 1
        try:
            yield self._tree_root()
        finally:
            self._holds -= 1
            self._maybe_release()

    def _tree_root(self) -> int | None:
        if self._hold_fd == -1 or self.shim_pid <= 0:
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
        if self._held:
            self._held = False
            self._holds -= 1
            self._maybe_release()

    def _maybe_release(self) -> None:
        """Let the shim take another job, once this one is done and nobody holds its tree."""
        if self.done.is_set() and self._holds == 0 and self._hold_fd != -1:
            os.close(self._hold_fd)
            self._hold_fd = -1

    def __repr__(self) -> str:
        return f"<Job {self.job} pid={self.pid} shim={self.shim_pid} argv={self.argv!r}>"
