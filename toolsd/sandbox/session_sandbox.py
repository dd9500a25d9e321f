"""One session's sandbox as one object: its scratch folder (the sandbox's /tmp), its home
folder, its cgroups, its launcher (bubblewrap, with the launcher as the sandbox's init) and
its mount guard. Written against values (SandboxSpec, SpawnRequest), not against the daemon.

Resource handling: `open()` makes them in that order, in the caller's nursery; `aclose()`
removes whatever `open()` got to, and may be called more than once.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import trio

from toolsd.runtime import threads
from toolsd.sandbox.launch import cgroups

from toolsd.sandbox.bwrap import home
from toolsd.sandbox.errors import Fault, LauncherDied, LauncherError, LauncherLimit, SandboxError
from toolsd.sandbox.bwrap.guards import GuardRounds, MountGuard
from toolsd.sandbox.launch.job import Job
from toolsd.sandbox.launch.launcher_client import Launcher
from toolsd.sandbox.bwrap.policy import Limits, Policy, bwrap_argv
from toolsd.sandbox.launch.spawn_request import SpawnRequest

__all__ = ["Sandbox", "SandboxSpec", "SPAWN_TIMEOUT_S"]

log = logging.getLogger("toolsd.session")

# A spawn that takes longer than this means the launcher is stuck (sandboxed, pid 1 of its
# namespace, its code cannot stop it; unsandboxed it can).
SPAWN_TIMEOUT_S = 10.0
# Sandboxes whose folders are being removed at once. Removing a home is mostly the
# filesystem's work on its copies and mount points, which threads cannot speed up: many at
# once (sessions closed together) only took the worker threads and the CPU from the calls.
REMOVE_THREADS = 2


@dataclass(frozen=True)
class SandboxSpec:
    """Everything a sandbox is made from, fixed before it starts."""
    name: str  # names its cgroups and its log lines (the session's first id)
    workspace: str  # the launcher's folder
    env: Mapping[str, str]  # the launcher's environment
    scratch: str  # the host folder that is its /tmp (made at open, removed at close)
    limits: Limits
    # Sandboxed: the policy bwrap mounts, and bwrap's path. Without, the launcher runs on the
    # host under `wrapper` (empty, or a test's own sandbox argv).
    policy: Policy | None = None
    bwrap: str | None = None
    wrapper: tuple[str, ...] = ()
    home_dir: str | None = None  # its own home folder, made at open (None: none of its own)
    cgroup_places: Mapping[str, cgroups.Place] = dataclasses.field(default_factory=dict)
    listen: str | None = None  # the launcher's listening address for port forwards
    python: str = sys.executable


def rlimits_of(limits: Limits, *, memory_cgroup: bool) -> dict[str, tuple[int, int]]:
    """The launcher's names for the limits (setrlimit's: "as", "nproc"); RLIMIT_AS only
    where no memory cgroup limits the sandbox."""
    return {name.removeprefix("RLIMIT_").lower(): value for name, value
            in limits.rlimits(address_space=not memory_cgroup).items()}


class Sandbox:
    def __init__(self, spec: SandboxSpec, *, starts_after: trio.Event | None = None,
                 guard_rounds: GuardRounds | None = None):
        """`starts_after`: no command starts until it is set (the session's look at its
        repositories, say). `guard_rounds`: the rounds that check its mount guard, shared
        with the daemon's other sandboxes (None: rounds of its own). A guarded policy whose
        workspace already changed is refused here (SandboxError)."""
        self.spec = spec
        self._starts_after = starts_after
        self._guard_rounds = guard_rounds
        self.rlimits = rlimits_of(spec.limits,
                                  memory_cgroup="memory" in spec.cgroup_places)
        self.guard = MountGuard(spec.policy) if spec.policy is not None else None
        self.launcher: Launcher | None = None
        self.cgroup: cgroups.SessionCgroups | None = None

    # ------------------------------------------------------------ lifecycle

    async def open(self, nursery: trio.Nursery,
                   on_guards_lost: Callable[[list[str]], None] = lambda paths: None) -> None:
        """Make the sandbox and start its launcher in `nursery`, and, sandboxed, watch its
        hiding mounts (`on_guards_lost(paths)` when the host replaces one). SandboxError
        (UNAVAILABLE) if the launcher does not start; aclose() removes what was made."""
        spec = self.spec
        os.makedirs(spec.scratch, mode=0o700, exist_ok=True)
        if spec.home_dir is not None and spec.policy is not None:
            await trio.to_thread.run_sync(home.make_home, spec.policy, spec.home_dir,
                                          spec.env["HOME"])
        if spec.cgroup_places:
            self.cgroup = cgroups.SessionCgroups.create(
                spec.cgroup_places, spec.name, pids=spec.limits.pids,
                memory_mb=spec.limits.memory_mb)
            if "memory" in spec.cgroup_places and not self.cgroup.limits("memory"):
                log.warning("session %s: memory limited by RLIMIT_AS instead", spec.name)
                self.rlimits = rlimits_of(spec.limits, memory_cgroup=False)
        if self.guard is not None:
            self.guard.note_folders()  # the folders as the sandbox is about to bind them
        try:
            self.launcher = await Launcher.start(
                nursery, wrapper=self._wrapper(), env=dict(spec.env), cwd=spec.workspace,
                python=spec.python, listen=spec.listen)
        except LauncherError as e:
            raise SandboxError(Fault.UNAVAILABLE,
                               f"could not start the session's sandbox: {e}") from None
        if spec.bwrap is not None and self.guard is not None:
            rounds = self._guard_rounds
            if rounds is None:
                rounds = GuardRounds()
                nursery.start_soon(rounds.run)
            await nursery.start(rounds.watch, self.guard, self.launcher.host_pid,
                                f"session {spec.name}", on_guards_lost)

    def _wrapper(self) -> list[str]:
        prefix = self.cgroup.join_argv() if self.cgroup else []
        spec = self.spec
        if spec.bwrap is not None and spec.policy is not None:
            return prefix + bwrap_argv(spec.policy, bwrap=spec.bwrap)
        return prefix + list(spec.wrapper)

    async def aclose(self) -> None:
        """End the launcher (the pid namespace takes what is left) and remove the sandbox's
        folders and cgroups. Shielded: it finishes even when cancelled."""
        with trio.CancelScope(shield=True):
            if self.launcher is not None:
                await self.launcher.aclose()
            if self.cgroup is not None:
                self.cgroup.remove()
            await trio.to_thread.run_sync(self._remove_folders, limiter=threads.limiter(
                "remove", REMOVE_THREADS))

    def _remove_folders(self) -> None:
        shutil.rmtree(self.spec.scratch, True)
        if self.spec.home_dir is not None:
            shutil.rmtree(self.spec.home_dir, True)

    async def end_launcher(self) -> None:
        """Stop the launcher now (its sandbox ends with it); the folders stay for aclose."""
        if self.launcher is not None:
            await self.launcher.aclose()

    def alive(self, *, now: bool = False) -> bool:
        """Whether the launcher runs: as its reader last saw, or with `now`, asked now."""
        launcher = self.launcher
        if launcher is None:
            return False
        return not launcher.gone_now() if now else launcher.alive

    @property
    def guarded(self) -> bool:
        """Whether its hiding mounts are watched (always true of an unsandboxed one)."""
        return self.spec.bwrap is None or (self.guard is not None and self.guard.watching)

    def lost_guards(self) -> list[str]:
        """The hiding or protecting mounts the host has replaced since the start (cheap when
        nothing changed: MountGuard.check)."""
        return self.guard.check() if self.guard is not None else []

    # ------------------------------------------------------------ commands

    @property
    def shell(self) -> tuple[str, str]:
        """(name, path) of the shell for shell.run: bash, else sh, as the sandbox has them."""
        ready = self.launcher.ready
        if ready.bash:
            return "bash", ready.bash
        if ready.sh:
            return "sh", ready.sh
        raise SandboxError(Fault.UNAVAILABLE, "the sandbox has neither bash nor sh on its PATH")

    @property
    def devnull(self) -> int:
        """A read-only /dev/null to give a command as its stdin (the launcher's)."""
        fd = -1 if self.launcher is None else self.launcher.devnull
        if fd == -1:
            raise SandboxError(Fault.CLOSED, "the session is closed or its sandbox died; "
                               "open a new session")
        return fd

    async def spawn(self, request: SpawnRequest, *, what: str | None = None,
                    fault: Fault = Fault.REFUSED) -> Job:
        """Start `request` (the fds stay the caller's) and return its Job: the one way every
        tool starts a command. A launcher that does not answer within SPAWN_TIMEOUT_S is
        stuck, and ends the sandbox. Fails with SandboxError: the sandbox is gone, the
        session's process limit, or `fault` with "could not start `what`" (argv[0] by
        default)."""
        if self._starts_after is not None and not self._starts_after.is_set():
            await self._starts_after.wait()
        what = what or (request.argv[0] if request.argv else "the command")
        try:
            if self.launcher is None:
                raise LauncherDied("the sandbox is not running")
            try:
                # The deadline rides along rather than a scope around the call: the wait for
                # the answer has a scope of its own already (Job.wait_answered).
                job = await self.launcher.spawn(
                    request, rlimits=self.rlimits,
                    deadline=trio.current_time() + SPAWN_TIMEOUT_S)
            except trio.TooSlowError:
                # The launcher answers in milliseconds; one that does not is stuck
                # (unsandboxed, a command of the session can stop it; sandboxed, the host
                # can). Nothing can be started or supervised there any more: end it.
                await self.launcher.aclose()
                raise LauncherDied("the launcher did not answer") from None
        except LauncherDied:
            raise SandboxError(Fault.CLOSED, "the session is closed or its sandbox died; "
                               "open a new session") from None
        except LauncherLimit as e:
            raise SandboxError(Fault.LIMIT, f"could not start {what}: {e}; the session is at "
                               f"its process limit (limits.pids {self.spec.limits.pids}): "
                               f"wait for commands to end or stop background processes"
                               ) from None
        except LauncherError as e:
            raise SandboxError(fault, f"could not start {what}: {e}") from None
        return job
