"""A session: one sandbox (bwrap + launcher), its turns' REPLs and its background processes.

Resource handling: `run()` is the session's task in the Supervisor's nursery; it owns the
launcher and every helper task of the session. `close()` stops processes and REPLs, kills the
sandbox (its pid namespace takes anything left), removes the scratch /tmp, and ends `run()`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Awaitable, Callable, Protocol

import trio

from toolsd.daemon import workspaces
from toolsd.daemon.activity import Activity
from toolsd.daemon.session_life import MOVES, SessionLife, refusal
from toolsd.daemon.egress import session_network
from toolsd.daemon.session_memory import MemoryNotes
from toolsd.sandbox.launch import file_helper_client
from toolsd.sandbox.errors import SandboxError
from toolsd.sandbox.git_watch.repositories import RepositoryWatch
from toolsd.sandbox.bwrap.policy import Limits, check_env_size, sandbox_env, validate_env
from toolsd.sandbox.session_sandbox import Sandbox, SandboxSpec
from toolsd.sandbox.bwrap.session_policy import (
    check_workspace,
    command_env,
    plan_view,
    resolve_cwd,
    session_policy,
)
from toolsd.wire.protocol import (
    BAD_PARAMS,
    SANDBOX_UNAVAILABLE,
    SESSION_CLOSED,
    UNSET,
    SessionCloseResult,
    SessionInfo,
    SessionOpenParams,
    ToolsdError,
)
from toolsd.tools.repl_turns import ReplTurns
from toolsd.tools.wire_errors import as_wire
from toolsd.tools.spill import Spills

if TYPE_CHECKING:
    from toolsd.daemon.egress import EgressHost
    from toolsd.sandbox.launch.job import Job
    from toolsd.tools.host import Host
    from toolsd.tools.ports import PortForwards
    from toolsd.tools.process_table import ProcessTable
    from toolsd.tools.background_process import BackgroundProcess

log = logging.getLogger("toolsd.session")


class SessionOwner(Protocol):
    """What a session takes from the daemon that owns it (the Supervisor): the facts found
    at start, the nursery its close runs in, and the two tables it shares with the other
    sessions. A Protocol, so that the session never imports its owner."""

    host: Host
    egress: EgressHost
    nursery: trio.Nursery
    forwards: PortForwards
    processes: ProcessTable


class Session(MemoryNotes):
    def __init__(self, session_id: str, owner: SessionOwner, params: SessionOpenParams,
                 made_workspace: bool = False):
        self.id = session_id
        self.owner = owner
        self.host = host = owner.host
        self.workspace = check_workspace(params.workspace)
        # The daemon made it (daemon/workspaces.py): run() removes it at close.
        self.made_workspace = made_workspace
        self.tenant = "local"  # who opened it (daemon/tenants.py); the supervisor sets it
        self.net = session_network(params.network, owner.egress, host.bwrap is not None)
        self.network = self.net.name
        self.writable = params.writable
        try:
            self.user_env = validate_env(params.env)
        except ValueError as e:
            raise ToolsdError(BAD_PARAMS, f"session.open: {e}") from None
        defaults = host.limits
        given = {k: getattr(params.limits, k) for k in ("memory_mb", "pids", "cpu_s", "file_mb")}
        self.limits = Limits(**{
            k: (v if v is not None else getattr(defaults, k)) for k, v in given.items()
        }, nofile=defaults.nofile)
        self.sandbox_kind = host.sandbox_kind
        if self.sandbox_kind == "none" and not self.writable:
            raise ToolsdError(SANDBOX_UNAVAILABLE, "writable: false needs the sandbox, and this "
                              "daemon has none (toolsd doctor says why); install bubblewrap")
        self.opened_at = time.time()
        self.turns = ReplTurns()
        self.life = SessionLife.STARTING  # changed by _move only
        self.activity = Activity(trio.current_time())
        # The real python3 of the sandbox, once asked: read-only to tools (remember_python).
        self.python_exe: str | None = None
        self.nursery: trio.Nursery | None = None
        self._close_done = trio.Event()
        self._stop = trio.Event()
        self.close_result: SessionCloseResult | None = None
        self.ended_why: str | None = None  # why toolsd ended the session by itself
        # What the session adds that the host's git would run.
        self.repositories = RepositoryWatch(self.workspace, self.writable, session_id)
        self.scratch = os.path.join(host.scratch, session_id)
        # The scratch folder is the sandbox's /tmp.
        self.spills = Spills(self.scratch, self.scratch if host.bwrap is None else "/tmp",
                             self.limits.file_mb << 20)
        # The session's home folder: bound at HOME's real path (docs/sandbox.md, "The home
        # folder"), named after the session's first id (a spare keeps its folders' names).
        self.home_dir = self.scratch + "-home"
        home_path = os.path.expanduser("~")
        view = plan_view(home_path=home_path, workspace=self.workspace,
                         hidden_paths=host.hidden_paths, shown=host.shown,
                         bwrap=host.bwrap, made=made_workspace)
        self.home_is_own = view.home_is_own and host.bwrap is not None
        self.env = sandbox_env(
            home=home_path,
            path=os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            lang=os.environ.get("LANG", "C.UTF-8"),
            extra={**self.net.env, **self.user_env},
            own_home=self.home_is_own, no_network=self.network == "none",
        )
        try:
            check_env_size(self.env)
        except ValueError as e:
            raise ToolsdError(BAD_PARAMS, f"session.open: {e}") from None
        try:
            # A policy the sandbox cannot mount is refused here, not later. Kept for the
            # start, so that it is not made twice.
            self.policy = session_policy(
                workspace=self.workspace, scratch=self.scratch, writable=self.writable,
                network=self.net.policy_network, view=view, env=self.env,
                home_dir=self.home_dir, **self.net.policy_fields())
        except ValueError as e:
            raise ToolsdError(BAD_PARAMS, f"session.open: {e}") from None
        self.sandbox = Sandbox(SandboxSpec(
            name=session_id, workspace=self.workspace, env=self.env, scratch=self.scratch,
            limits=self.limits, policy=self.policy, bwrap=host.bwrap,
            home_dir=self.home_dir if self.home_is_own else None,
            cgroup_places=host.cgroup_places, listen=self.net.listen),
            starts_after=self.repositories.known,  # no command before the baseline
            guard_rounds=host.guard_rounds)
        # file.*'s helper, started on first use.
        self.files = file_helper_client.FileHelper.of_session(self)

    # ------------------------------------------------------------ lifecycle

    # ------------------------------------------------------------ mount guards

    def check_guards(self) -> None:
        """End the session if the host has replaced a path it hides or protects: the kernel
        removes a mount from every namespace when the host replaces the path under it (`git
        config` renames a new .git/config into place), and from then on the sandbox would
        show the new file (docs/sandbox.md, "Paths replaced on the host"). `ended_why` says
        so afterwards. Cheap when nothing changed (MountGuard.check)."""
        if self.life in (SessionLife.STARTING, SessionLife.OPEN):
            self._guards_lost(self.sandbox.lost_guards())

    def _guards_lost(self, paths: list[str]) -> None:
        if not paths or not self._move(SessionLife.ENDED):
            return
        self.ended_why = (f"{', '.join(paths)} changed on the host while the session ran, "
                          f"and its sandbox no longer hid or protected it")
        log.warning("session %s ended: %s", self.id, self.ended_why)
        self.owner.nursery.start_soon(self.close)

    def adopt(self, session_id: str) -> None:
        """A warm spare becomes session `session_id` (its scratch folder and cgroup keep
        their names)."""
        self.id = self.repositories.session_id = session_id
        self.opened_at = time.time()
        self.activity.restart(trio.current_time())

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The session's task. Reports a start failure through `task_status.started(error)`
        rather than raising it, so the caller gets one plain ToolsdError."""
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                # The workspace's repositories as they are before any command runs (the
                # baseline of host_exec): looked at while the sandbox starts, and until
                # then no command starts (the sandbox's starts_after).
                nursery.start_soon(self.repositories.start)
                try:
                    await self.sandbox.open(nursery, self._guards_lost)
                    await self.net.start(nursery, self.sandbox.launcher.listeners)
                except SandboxError as e:
                    self._move(SessionLife.FAILED)
                    task_status.started(as_wire(e))
                    nursery.cancel_scope.cancel()
                    return
                if self.host.bwrap is None:
                    log.warning("session %s runs unsandboxed: %s", self.id,
                                self.host.why_no_sandbox)
                self._move(SessionLife.OPEN)
                task_status.started(None)
                await self._stop.wait()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self.sandbox.aclose()
                await self.repositories.aclose()
                if self.made_workspace:
                    await trio.to_thread.run_sync(workspaces.remove, self.workspace)

    async def close(self) -> SessionCloseResult | None:
        """End everything of the session; idempotent (a second caller waits for the first)."""
        if not self._move(SessionLife.CLOSING):
            await self._close_done.wait()
            return self.close_result
        with trio.CancelScope(shield=True):
            await self.owner.forwards.close_session(self.id)
            how = f"ended: {self.ended_why}" if self.ended_why else "closed"
            closed = ToolsdError(SESSION_CLOSED, f"session {self.id} was {how}, which stops "
                                 f"everything it runs; open a new session")
            repls = await self.turns.aclose(closed)
            stopped = 0
            async with trio.open_nursery() as n:
                for proc in list(self.processes.values()):
                    if proc.running:
                        stopped += 1
                        n.start_soon(proc.stop, 0.5)
            # Last look, with nothing of the session running any more.
            result = await self.reported(SessionCloseResult(processes_stopped=stopped,
                                                            repls_stopped=repls))
            self._stop.set()
            await self.sandbox.end_launcher()
            if self.made_workspace:  # gone by the time close answers (and again in run())
                await trio.to_thread.run_sync(workspaces.remove, self.workspace)
            self.close_result = result
            self._move(SessionLife.CLOSED)
            self._close_done.set()
        return self.close_result

    def _move(self, to: SessionLife) -> bool:
        """The one way the session's state changes: False (and no change) for a move the
        lifecycle does not allow from where it is (a second close, say)."""
        if to not in MOVES[self.life]:
            return False
        self.life = to
        return True

    @property
    def closed(self) -> bool:
        """close() has begun (or the sandbox never started): nothing new may start."""
        return self.life in (SessionLife.FAILED, SessionLife.CLOSING, SessionLife.CLOSED)

    def refusal(self, *, now: bool = False, sandbox: bool = True) -> str | None:
        """Why the session cannot run a call (None if it can): the one question every caller
        asks. `now` asks the sandbox itself rather than what its reader last saw; without
        `sandbox`, a dead sandbox does not count (the session can still be named and
        closed)."""
        dead = (sandbox and self.sandbox.launcher is not None
                and not self.sandbox.alive(now=now))
        return refusal(self.id, self.life, self.ended_why, dead)

    def check_open(self) -> None:
        """ToolsdError (session_closed, saying why) unless the session can run calls."""
        self.check_guards()
        why = self.refusal()
        if why is not None:
            raise ToolsdError(SESSION_CLOSED, why)

    @property
    def alive(self) -> bool:
        """False once the session's sandbox died (killed from the host or from inside, or by
        the kernel), asked now; a closed session is not alive either."""
        return self.refusal(now=True) is None

    # ------------------------------------------------------------ activity

    @contextlib.contextmanager
    def call(self):
        """A call naming the session (or one of its processes) runs: the session is not
        idle meanwhile (see Activity)."""
        self.activity.begin()
        try:
            yield self
        finally:
            self.activity.end(trio.current_time())

    def ran_call(self) -> None:
        """A call naming the session ran to its end without waiting: as `call()` around
        it, without a context manager's calls."""
        self.activity.ran(trio.current_time())

    def keep_active(self, job: Job) -> None:
        """The session is not idle until `job`'s whole tree has ended (a background process,
        with whatever it left running)."""
        self.activity.begin()
        self.start_soon(self._active_until_done, job)

    async def _active_until_done(self, job: Job) -> None:
        try:
            await job.done.wait()
        finally:
            self.activity.end(trio.current_time())

    async def reported(self, result):
        """`result` with host_exec, looked at now that its call is over: every result of a
        call on a session carries it (left out while there is nothing)."""
        return self.reported_as(result, await self.repositories.look())

    def reported_as(self, result, host_exec: list[str]):
        """`result` with `host_exec` as looked at (repositories.look or look_now), and the
        connections the sandbox was refused meanwhile."""
        result.host_exec = host_exec or UNSET
        return self.net.report(result)

    # ------------------------------------------------------------ what it owns

    @property
    def processes(self) -> Mapping[str, BackgroundProcess]:
        """The session's background processes by id, in start order (the Supervisor's
        ProcessTable holds them)."""
        return self.owner.processes.of(self.id)

    def start_soon(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        """Run `fn(*args)` as a task of the session: it ends when the session closes."""
        if self.nursery is None:
            raise ToolsdError(SESSION_CLOSED, f"session {self.id} is not running; open a new one")
        self.nursery.start_soon(fn, *args)

    def remember_python(self, path: str) -> None:  # repl.python_executable
        self.python_exe = path

    def info(self, forwards=()) -> SessionInfo:  # for session.list, with its port.forward
        return SessionInfo(
            session=self.id, workspace=self.workspace, sandbox=self.sandbox_kind,
            network=self.network, writable=self.writable, forwards=list(forwards),
            processes=sum(1 for bg in self.processes.values() if bg.running),
            repls=self.turns.repl_count, opened_at=self.opened_at,
            alive=self.alive, host_exec=self.repositories.last_seen() or UNSET,
            tenant=self.tenant)

    # ------------------------------------------------------------ paths

    def resolve_cwd(self, cwd: str | None) -> str:
        """A command's folder: inside the workspace (relative paths are taken from it)."""
        return resolve_cwd(self.workspace, cwd)

    def command_env(self, extra: dict[str, str]) -> dict[str, str]:
        """The session's environment with a call's `extra`, checked."""
        return command_env(self.env, extra)

