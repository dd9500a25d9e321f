"""Host side of the launcher channel: start `driver/launcher.py` (inside bwrap or bare), spawn
commands through it, learn their host pids and exits.

Its parts: the channel's sockets (channel.py), the host processes of the sandbox (wrapper.py),
one spawned command (job.py), the ways a spawn fails (errors.py). The wire format is described
in driver/launcher.py.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import os
import signal
import socket
import sys
from collections.abc import Sequence

import trio

from driver import LAUNCHER_PY
from toolsd.runtime import threads
from toolsd.sandbox.launch import proctree
from toolsd.sandbox.launch.channel import (Channel, Connected, Done, Exited, Failed, FromLauncher,
                                    Listening, Pong, Ready, Started, close_all,
                                    connect_message, listeners_of, ping_message, spawn_message)
from toolsd.sandbox.launch.connects import Connects
from toolsd.sandbox.errors import LauncherDied, LauncherError, LauncherLimit
from toolsd.sandbox.launch.job import Job, JobState
from toolsd.sandbox.launch.spawn_request import SpawnRequest
from toolsd.sandbox.launch.wrapper import Wrapper, host_pid_of, kill_shims

__all__ = ["Launcher", "Job", "LauncherError", "LauncherLimit", "LauncherDied", "LAUNCHER_PY",
           "CLEAN_EXIT_S", "KILL_THREADS"]

log = logging.getLogger("toolsd.launcher")

# How long aclose lets the launcher end (and reap) its own tree before killing from the host.
CLEAN_EXIT_S = 2.0
READY_TIMEOUT_S = 30.0
# Tree kills at once, each in a worker thread of its own (a SIGTERM grace holds its thread).
KILL_THREADS = 256
# A spawn not answered within this time looks for commands stopped before their exec.
SPAWN_STALL_S = 1.0
# Sends of a spawn whose shim was killed before it ran the command (`kill -9 -1`): it is resent.
SPAWN_TRIES = 3


class Launcher:
    """Resource handling: owns the wrapper process (bwrap or the bare launcher), the channel to
    the launcher and the reader tasks it runs in the nursery given to `start`. `aclose()` ends
    every process of the sandbox, waits for them, and closes all of that; call it exactly as
    you would close a file (it is idempotent and shielded from cancellation).

    The fds given to `spawn` stay the caller's: close your copies of the child's ends once
    `spawn` returns, so that you see EOF when the command's tree is done with them."""

    def __init__(self, wrapper: Wrapper, channel: Channel):
        self._wrapper = wrapper
        self._channel = channel
        self._tasks: trio.Nursery | None = None  # our reader's, for kills of abandoned jobs
        self.ready = Ready()  # what the launcher said when it started
        # With `listen`: the sockets it made in the sandbox's network namespace, by their
        # "kind:port" names; whoever takes them closes them.
        self.listeners: dict[str, socket.socket] = {}
        self.alive = True
        self._death: str | None = None
        self._jobs: dict[int, Job] = {}
        self._numbers = itertools.count(1)
        self._pongs: dict[int, trio.Event] = {}
        self._connects = Connects()
        self._scope = trio.CancelScope()
        self._tasks_done = trio.Event()
        self._closing = False
        self._closed = trio.Event()

    # ------------------------------------------------------------ start

    @classmethod
    async def start(cls, nursery: trio.Nursery, *, wrapper: list[str], env: dict[str, str],
                    python: str = sys.executable, cwd: str = "/",
                    launcher_py: str = LAUNCHER_PY, listen: str | None = None) -> Launcher:
        """Start `wrapper + [python, -I, -S, launcher_py, FD, SPAWN_FD]` (see BOOTSTRAP for how,
        when `python` is ours) and wait until the launcher says it is ready. Raises
        LauncherError with the wrapper's own error text if it never does. `launcher_py` is for
        tests that wrap the launcher to inject faults."""
        wrapped, ours, spawn_ours = Wrapper.start(wrapper, env=env, python=python, cwd=cwd,
                                                  launcher_py=launcher_py, listen=listen)
        self = cls(wrapped, Channel(ours, spawn_ours))
        try:
            with trio.fail_after(READY_TIMEOUT_S):
                await self._receive_ready()
        except trio.TooSlowError:
            with trio.CancelScope(shield=True):
                await self._wrapper.force_end()
                self._release()
            raise LauncherError(f"the sandbox launcher did not say ready within "
                                f"{READY_TIMEOUT_S:.0f} s; it was killed") from None
        except BaseException:
            with trio.CancelScope(shield=True):
                await self._wrapper.force_end()
                self._release()
            for sock in self.listeners.values():
                sock.close()
            raise
        nursery.start_soon(self._run)
        return self

    async def _receive_ready(self) -> None:
        msg, fds = await self._channel.recv()
        if isinstance(msg, Listening):  # asked for with `listen`, it comes first
            self.listeners = listeners_of(msg, fds)
            msg, fds = await self._channel.recv()
        try:
            if not isinstance(msg, Ready) or not fds:
                await self._wrapper.wait_exits(CLEAN_EXIT_S)
                raise LauncherError("the sandbox launcher did not start: "
                                    + self._wrapper.stderr_text())
            self.ready = msg
            if not self._wrapper.adopt_launcher(fds):
                raise LauncherError("the sandbox launcher exited right after starting: "
                                    + self._wrapper.stderr_text())
        finally:
            close_all(fds)

    @property
    def host_pid(self) -> int:
        """The launcher's pid on the host; -1 until it said ready."""
        return self._wrapper.host_pid

    @property
    def wrapper_pid(self) -> int:
        return self._wrapper.wrapper_pid

    # ------------------------------------------------------------ channel

    async def _send(self, msg: dict, fds: Sequence[int] = (), *, spawn: bool = False,
                    deadline: float = math.inf) -> None:
        try:
            await self._channel.send(msg, fds, spawn=spawn, deadline=deadline)
        except (OSError, trio.ClosedResourceError) as e:
            self._mark_dead(f"the sandbox launcher's channel failed: {e}")
            raise LauncherDied(self._death) from None

    async def _run(self) -> None:
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    self._tasks = nursery
                    nursery.start_soon(self._watch_launcher)
                    await self._read_loop()
                    nursery.cancel_scope.cancel()
        finally:
            # Whatever ended the reader (aclose, the caller's nursery being cancelled), nobody
            # will answer waiters any more: wake them with LauncherDied.
            self._mark_dead("the sandbox launcher's channel is no longer read; close the "
                            "session and open a new one")
            self._tasks_done.set()

    async def _watch_launcher(self) -> None:
        # Unsandboxed, shims outlive a killed launcher and keep our socket open: its pidfd,
        # not EOF, is what says it is gone. Its wrapper's too: once bwrap is gone its launcher
        # is being killed (--die-with-parent), and as pid 1 of the sandbox that launcher
        # exits only after every other process in it.
        async with trio.open_nursery() as nursery:
            async def wait_exit(fd: int) -> None:
                await trio.lowlevel.wait_readable(fd)
                nursery.cancel_scope.cancel()

            for fd in {self._wrapper.launcher_fd, self._wrapper.wrapper_fd}:
                nursery.start_soon(wait_exit, fd)
        self._mark_dead("the sandbox launcher exited (killed from the host or by the kernel, "
                        "or unsandboxed by a command?); close the session and open a new one")

    async def _read_loop(self) -> None:
        while True:
            try:
                msg, fds = await self._channel.recv()
            except (OSError, trio.ClosedResourceError) as e:
                self._mark_dead(f"the sandbox launcher's channel failed: {e}")
                return
            if msg is None:
                self._mark_dead("the sandbox launcher exited; close the session and open a new "
                                "one")
                return
            try:
                self._dispatch(msg, fds)
            finally:
                close_all(fds)

    def _dispatch(self, msg: FromLauncher | object, fds: list[int]) -> None:
        if isinstance(msg, Pong):
            event = self._pongs.pop(msg.n, None)
            if event is not None:
                event.set()
            return
        if isinstance(msg, Connected):
            self._connects.answer(msg, fds)
            return
        if not isinstance(msg, (Started, Failed, Exited, Done)):
            return  # unreadable, or a second `ready`
        job = self._jobs.get(msg.job)
        if job is None:
            return  # e.g. the launcher's second word on a shim that already reported
        spawning = job.state is JobState.SPAWNING
        match msg:
            case Started() if spawning and len(fds) >= 2 + job.want_pid:
                # fds: the shim's pidfd; the hold pipe, whose closing (see Job) frees the
                # shim for other jobs; the command's pidfd if its pid is wanted; a tty's master.
                job.started(host_pid_of(fds[0]), fds.pop(1),
                            host_pid_of(fds[1]) if job.want_pid else -1)
                if len(fds) > 1 + job.want_pid and not job.abandoned:
                    job.terminal_fd = fds.pop(1 + job.want_pid)  # a "tty" spawn's master side
                if job.abandoned and job.want_pid:
                    try:
                        signal.pidfd_send_signal(fds[1], signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                if job.abandoned:
                    # And whatever it started meanwhile: nobody will ever ask for it.
                    self._tasks.start_soon(self._end_abandoned, job)
            case Failed() if spawning:
                del self._jobs[job.job]
                job.failed(msg.message or "the launcher could not start the command",
                           limit=msg.limit, unstarted=msg.unstarted)
            case Exited():
                # Before `started`: the shim died (or was killed, stopped by its command)
                # between starting the command and saying so; the launcher ended what it had
                # started and reports it. The call gets the command's end, without its pids.
                if spawning or msg.done:
                    del self._jobs[job.job]
                job.ended(msg.code, msg.signal, done=msg.done)
            case Done():
                del self._jobs[job.job]
                job.finished()

    async def _end_abandoned(self, job: Job) -> None:
        with trio.CancelScope(shield=True), job.holding_tree() as shim_pid:
            if shim_pid is not None:
                await trio.to_thread.run_sync(
                    lambda: proctree.kill_tree(shim_pid, grace_s=0, include_root=False),
                    limiter=threads.limiter("kill", KILL_THREADS))

    def _mark_dead(self, reason: str) -> None:
        if self._death is not None:
            return
        if not self._closing:
            log.warning("the sandbox launcher (pid %s) is gone: %s; its last words: %s",
                        self.host_pid, reason, self.death_reason())
        self._death = reason
        self.alive = False
        for job in self._jobs.values():
            job.launcher_died()
        for event in self._pongs.values():
            event.set()
        self._connects.fail_all(reason)

    def gone_now(self) -> bool:
        """Whether the launcher or its wrapper has exited or is exiting, asked now: the reader
        task, which sets `alive`, may not have run since. Once this says so, `alive` says so
        too, so that every call of the session meets the death that session.list showed."""
        if self.alive and self._wrapper.exiting():
            self._mark_dead("the sandbox launcher or its wrapper exited or was killed; close "
                            "the session and open a new one")
        return not self.alive

    def death_reason(self) -> str:
        """Why the launcher is gone: the last line it wrote to stderr, if any."""
        return (self._wrapper.last_words() or self._death
                or "the sandbox launcher is gone")

    def _check_alive(self) -> None:
        if self._death is not None:
            raise LauncherDied(self._death)

    # ------------------------------------------------------------ requests

    async def spawn(self, request: SpawnRequest, *, rlimits=None, deadline=math.inf) -> Job:
        """Start what `request` asks in the sandbox, in its own session, with `rlimits` (a
        Sandbox's) unless it has its own. Returns once the command runs. LauncherError says why it
        could not start; trio.TooSlowError at `deadline` (trio's clock) that the launcher is stuck.
        Without `want_pid` job.pid stays -1 (the command and its tree are still reached through the
        shim). With `held` the shim stays this job's until `job.let_go()`, even once the job is
        done: a caller can answer first, and wake the shim for its next job after. With `tty`, the
        terminal's master side is in job.terminal_fd, the caller's."""
        r = request
        if not r.argv:
            raise LauncherError("empty command: give at least the program to run")
        rlimits, tries = (r.rlimits if r.rlimits is not None else rlimits), 1
        while (job := await self._spawn_once(r, rlimits, tries == SPAWN_TRIES, deadline)) is None:
            tries += 1
        return job

    async def _spawn_once(self, r: SpawnRequest, rlimits, last_try: bool, deadline) -> Job | None:
        """One spawn request (as `spawn`); None if the sandbox's code killed the shim that took it
        before it ran the command (and this is not the `last_try`): it may be sent again."""
        self._check_alive()
        job = Job(next(self._numbers), [str(a) for a in r.argv], r.want_pid, r.held)
        self._jobs[job.job] = job
        msg = spawn_message(job.job, job.argv, r.cwd, r.env, rlimits, ack=r.want_pid,
                            tty=r.tty, resume=r.resume_stopped)
        fds = [r.stdin, r.stdout, r.stderr, *r.extra_fds]
        try:
            await self._send(msg, fds, spawn=True, deadline=deadline)
        except BaseException:
            del self._jobs[job.job]  # never sent: nothing will answer for it
            raise
        try:
            # A command may stop the shim that started it before that says `started`, or
            # the reader before it takes the request: the launcher resumes its shims. Not
            # a command between its fork and its exec, which its shim waits for.
            await job.wait_answered(SPAWN_STALL_S, functools.partial(
                trio.to_thread.run_sync, self._wrapper.resume_stopped_spawns), deadline)
        except BaseException:
            # Cancelled after the request went out: the command may start anyway, with nobody
            # left to stop it, so it is killed as soon as it does (see _dispatch); if it has
            # started already, now.
            job.abandon()
            if job.answered.is_set() and job.failure is None and self._tasks is not None:
                self._tasks.start_soon(self._end_abandoned, job)
            raise
        failure = job.failure
        if failure is not None or (job.shim_pid == -1 and not self.alive):
            job.let_go()  # nobody gets the job to let it go later
        if failure is not None and failure.unstarted and not last_try:
            return None
        if failure is not None:
            raise (LauncherLimit if failure.limit else LauncherError)(failure.message)
        if job.shim_pid == -1 and not self.alive:
            job.abandon()
            raise LauncherDied(self._death or "the sandbox launcher died")
        return job

    @property
    def devnull(self) -> int:
        """The channel's read-only /dev/null (spawn_with_pipe's stdin); -1 once closed."""
        return self._channel.devnull

    async def start_helper(self, argv: list[str], env: dict[str, str], fd: int) -> None:
        """Have the launcher run `argv` as a helper of its own, with `fd` (the caller's, to
        close) as its fd 3 (driver/launcher.py, start_helper): it answers on that socket."""
        self._check_alive()
        await self._send({"op": "helper", "argv": [str(a) for a in argv], "env": dict(env)},
                         [fd])

    async def ping(self) -> None:
        """Round trip to the launcher; LauncherDied if it is gone."""
        self._check_alive()
        n = next(self._numbers)
        event = self._pongs[n] = trio.Event()
        try:
            await self._send(ping_message(n))
            await event.wait()
        finally:
            self._pongs.pop(n, None)
        self._check_alive()

    async def connect(self, port: int, family: int = 4) -> int:
        """A non-blocking socket connected, or connecting, to `port` on the sandbox's
        loopback (`family` 4: 127.0.0.1, 6: ::1), made inside its network namespace; the
        caller's to close. connects.ConnectFailed if it failed at once or the launcher died."""
        self._check_alive()
        n = next(self._numbers)
        with self._connects.expect(n) as waiter:
            await self._send(connect_message(n, port, family))
            await waiter.answered.wait()
            return waiter.take()

    # ------------------------------------------------------------ closing

    async def aclose(self) -> None:
        """End every process of the sandbox and release everything; idempotent, shielded."""
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        with trio.CancelScope(shield=True):
            try:
                died_before = self._death is not None
                self._mark_dead("the sandbox launcher was closed")
                self._scope.cancel()
                await self._tasks_done.wait()
                # EOF: the launcher kills its tree, reaps it and exits (no zombie is left).
                self._channel.close()
                self._wrapper.end_namespace()  # or the kernel does, for a pid namespace
                if not await self._wrapper.wait_exits(CLEAN_EXIT_S):
                    await self._wrapper.force_end()
                leftovers = (self._wrapper.orphaned_shims(self._jobs.values()) if died_before
                             else [])
                if leftovers:
                    await trio.to_thread.run_sync(kill_shims, leftovers)
            finally:
                self._release()
                self._closed.set()

    def _release(self) -> None:
        self._channel.close()
        self._wrapper.release()
