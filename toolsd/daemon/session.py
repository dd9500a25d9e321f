"""A session: one sandbox (bwrap + launcher), its turns' REPLs and its background processes.

Resource handling: `run()` is the session's task in the Supervisor's nursery; it owns the
launcher and every helper task of the session. `close()` stops processes and REPLs, kills the
sandbox (its pid namespace takes anything left), removes the scratch /tmp, and ends `run()`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import select
import shutil
import sys
import time
import uuid

import trio

from driver import DRIVER_DIR
from toolsd.sandbox import cgroups, home, home_folders, hostexec, policy as sandbox
from toolsd.sandbox.launcher import Launcher, LauncherError
from toolsd.wire.protocol import (
    BAD_PARAMS,
    NOT_FOUND,
    SANDBOX_UNAVAILABLE,
    SESSION_CLOSED,
    UNSET,
    ToolsdError,
)
from toolsd.tools.spill import Spills

log = logging.getLogger("toolsd.session")


def check_workspace(path: str) -> str:
    if not os.path.isabs(path):
        raise ToolsdError(BAD_PARAMS, f"workspace must be an absolute path, got {path!r}")
    if not os.path.exists(path):
        raise ToolsdError(BAD_PARAMS, f"workspace {path} does not exist; create the folder first")
    if not os.path.isdir(path):
        raise ToolsdError(BAD_PARAMS, f"workspace {path} is not a folder")
    real = os.path.realpath(path)
    if real == "/":
        raise ToolsdError(BAD_PARAMS, "workspace cannot be / (the whole machine); pick a folder")
    try:
        real.encode("utf-8")
    except UnicodeEncodeError:
        raise ToolsdError(BAD_PARAMS, f"workspace {real!r} is not valid UTF-8; toolsd reports "
                          f"paths as text: rename the folder") from None
    return real


RUNTIME_DIRS = ("/run",)
# How often a session's hiding and protecting mounts are checked while its commands run (see
# Session.check_guards; every call that starts something checks too).
GUARD_CHECK_S = 0.5


def _identities(paths) -> tuple[tuple[str, int | None, int | None], ...]:
    """(path, st_dev, st_ino) of each path; None, None for one that is not there."""
    ids = []
    for path in paths:
        try:
            st = os.stat(path)
            ids.append((path, st.st_dev, st.st_ino))
        except OSError:
            ids.append((path, None, None))
    return tuple(ids)


def _read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


@functools.cache
def own_files() -> tuple[str, ...]:
    """toolsd's own files that the sandbox needs: the drivers, and the interpreter the
    launcher runs on (its prefix, the venv's and the base installation's)."""
    return tuple(sorted({os.path.realpath(DRIVER_DIR), os.path.realpath(sys.prefix),
                         os.path.realpath(sys.base_prefix),
                         os.path.dirname(os.path.abspath(sys.executable))}))


def own_files_under_tmp() -> tuple[str, ...]:
    """own_files() under /tmp: a session's /tmp is its private scratch folder, so without
    binding them back, a checkout under /tmp could not start a single session. (In a home
    folder they are listed there: home.plan's `keep`.)"""
    return tuple(p for p in own_files() if p == "/tmp" or p.startswith("/tmp/"))


class Turn:
    def __init__(self, turn_id: str):
        self.id = turn_id
        self.repls: dict = {}  # language -> Repl


class Activity:
    """What keeps a session from counting as idle (`toolsd serve --idle-timeout`): a call
    that names it, or one of its processes, in flight (a repl.exec included, with or without
    a task of its own), and a background process whose tree has not ended. Idle time counts
    from the end of the last of these (or from the session's opening). No I/O: the caller
    gives the time (trio.current_time)."""

    def __init__(self, now: float):
        self.busy = 0  # calls in flight and background trees alive
        self.since = now  # when the last of them ended

    def begin(self) -> None:
        self.busy += 1

    def end(self, now: float) -> None:
        self.busy -= 1
        self.since = max(self.since, now)

    def restart(self, now: float) -> None:
        """As if the session had just opened (a warm spare handed out)."""
        self.since = now

    def idle_for(self, now: float) -> float:
        return 0.0 if self.busy else max(0.0, now - self.since)


class Session:
    def __init__(self, session_id: str, supervisor, params):
        self.id = session_id
        self.supervisor = supervisor
        self.workspace = check_workspace(params.workspace)
        self.network = params.network
        self.writable = params.writable
        try:
            self.user_env = sandbox.validate_env(params.env)
        except ValueError as e:
            raise ToolsdError(BAD_PARAMS, f"session.open: {e}") from None
        defaults = supervisor.config.limits
        given = {k: getattr(params.limits, k) for k in ("memory_mb", "pids", "cpu_s", "file_mb")}
        self.limits = sandbox.Limits(**{
            k: (v if v is not None else getattr(defaults, k)) for k, v in given.items()
        }, nofile=defaults.nofile)
        # Without a memory cgroup (see run), RLIMIT_AS instead.
        self._set_rlimits(memory_cgroup="memory" in supervisor.cgroup_places)
        self.sandbox_kind = supervisor.sandbox_kind
        if self.sandbox_kind == "none" and not self.writable:
            raise ToolsdError(SANDBOX_UNAVAILABLE, "writable: false needs the sandbox, and this "
                              "daemon has none (toolsd doctor says why); install bubblewrap")
        self.opened_at = time.time()
        self.turns: dict[str, Turn] = {}
        self.processes: dict = {}  # bgN -> BackgroundProcess
        self.closed = False
        self.activity = Activity(trio.current_time())
        self.launcher: Launcher | None = None
        self.cgroup: cgroups.SessionCgroups | None = None
        self.python_exe: str | None = None  # the real python3 of the sandbox, once asked
        self.nursery: trio.Nursery | None = None
        self._close_done = trio.Event()
        self._stop = trio.Event()
        self._closing = False
        self.close_result = None
        self.ended_why: str | None = None  # why toolsd ended the session by itself
        self._mounts_fd = -1  # the sandbox's /proc/PID/mountinfo (see check_guards)
        self._mounts_poll = None
        # What the session adds that the host's git would run (None: a read-only workspace).
        self.host_exec_tracker = hostexec.Tracker(self.workspace) if self.writable else None
        self._host_exec_lock = trio.Lock()
        self.repositories_known = trio.Event()  # the baseline is taken: commands may start
        self._guard_dirs: list[str] = []  # guarding mount points that are folders
        self._guard_ids: dict = {}  # path -> (st_dev, st_ino) as the sandbox started
        self.scratch = os.path.join(supervisor.state.scratch, session_id)
        # The scratch folder is the sandbox's /tmp.
        self.spills = Spills(self.scratch, self.scratch if supervisor.bwrap is None else "/tmp",
                             self.limits.file_mb << 20)
        # The session's home folder: bound at HOME's real path (docs/sandbox.md, "The home
        # folder"), named after the session's first id (a spare keeps its folders' names).
        self.home_dir = self.scratch + "-home"
        for own in map(os.path.realpath, supervisor.hidden_paths()):
            if self.workspace == own or self.workspace.startswith(own.rstrip("/") + "/"):
                raise ToolsdError(BAD_PARAMS, f"workspace {self.workspace} is inside toolsd's "
                                  f"own folder {own}, which sessions must never see")
        home_path = os.path.expanduser("~")
        self._view = self._plan_view(home_path)
        self.home_is_own = self._view.home_is_own and supervisor.bwrap is not None
        self.env = sandbox.sandbox_env(
            home=home_path,
            path=os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            lang=os.environ.get("LANG", "C.UTF-8"),
            extra=self.user_env,
            git_config_global=(os.path.join(home_path, home.GIT_CONFIG) if self.home_is_own
                               else None),
        )
        try:
            sandbox.check_env_size(self.env)
        except ValueError as e:
            raise ToolsdError(BAD_PARAMS, f"session.open: {e}") from None
        try:
            # A policy the sandbox cannot mount is refused here, not later. Kept for the
            # start, a millisecond away: made again, it cost as much as the rest of the
            # daemon's part of session.open.
            self._policy = self.policy()
        except ValueError as e:
            raise ToolsdError(BAD_PARAMS, f"session.open: {e}") from None

    # ------------------------------------------------------------ lifecycle

    def _set_rlimits(self, *, memory_cgroup: bool) -> None:
        # The launcher names limits as setrlimit's man page does ("as", "nproc").
        self.rlimits = {name.removeprefix("RLIMIT_").lower(): value for name, value
                        in self.limits.rlimits(address_space=not memory_cgroup).items()}

    def _plan_view(self, home_path: str) -> home.View:
        """The homes and hidden paths as this session's sandbox shows them (home.plan)."""
        # Resolved: a symlinked folder must be covered where it really is.
        # /run holds the host's service sockets (D-Bus, docker, agents, $XDG_RUNTIME_DIR):
        # a read-only mount does not stop connect(), so they are hidden, not just read-only.
        hidden = [os.path.realpath(p) for p in (*self.supervisor.hidden_paths(), *RUNTIME_DIRS)]
        try:
            return home.plan(home=os.path.realpath(home_path), workspace=self.workspace,
                             hidden=hidden, shown=self.supervisor.config.shown,
                             keep=own_files())
        except home.CannotHide as e:
            raise ToolsdError(BAD_PARAMS, f"session.open: {e}") from None

    def policy(self) -> sandbox.Policy:
        view = self._view
        protected = [os.path.join(self.workspace, ".git", p) for p in ("hooks", "config")]
        return sandbox.Policy(
            workspace=self.workspace,
            scratch=self.scratch,
            writable=self.writable,
            network=self.network,
            hidden_dirs=view.hidden_dirs,
            hidden_files=view.hidden_files,
            protected=tuple(p for p in protected if os.path.exists(p)),
            env=self.env,
            extra_ro_binds=own_files_under_tmp(),
            pinned=tuple(p for p in [os.path.join(self.workspace, ".git")] if os.path.isdir(p)),
            proc_read_only=tuple(p for p in sandbox.PROC_READ_ONLY if os.path.exists(p)),
            folders=view.folders,
            home=self.home_dir if view.home_is_own else "",
        )

    # ------------------------------------------------------------ warm spares

    def spare_key(self) -> tuple:
        """What a sandbox made ahead must share with this session to serve it: the same
        policy (all but its scratch and home folders, which are the sandbox's own), the same
        limits. Of the folders shown entry by entry, only the session's home must list what
        the host's lists now: other homes (and --hide's folders) may be as they were when the
        spare started, up to SPARE_MAX_AGE_S before (other users' activity would otherwise
        keep every spare from fitting); a secret made since is not shown either way."""
        def comparable(name: str, value):
            if name == "folders":
                return tuple(f if f.writable else f.path for f in value)
            return value

        policy = tuple((f.name, comparable(f.name, getattr(self._policy, f.name)))
                       for f in dataclasses.fields(self._policy)
                       if f.name not in ("scratch", "home"))
        return policy, self.limits, tuple(sorted(self.rlimits.items())), self.sandbox_kind

    def fingerprint(self) -> tuple:
        """The identity of every path the sandbox binds, hides or protects: a folder removed
        and made again at the same path is another folder, which a sandbox made before does
        not show (or hide). In the session's home, every entry it binds, and what every
        file it copied holds (see spare_key for the other homes)."""
        p = self._policy
        own = [f for f in p.folders if f.writable]
        return (_identities((p.workspace, *p.hidden_dirs, *p.hidden_files, *p.protected,
                             *p.pinned, *(f.path for f in p.folders),
                             *(entry for f in own for entry in f.binds))),
                home_folders.copies_state([entry for f in own for entry in f.copies]))

    @property
    def guarded(self) -> bool:
        """Whether check_guards can see this sandbox's mounts (always, unsandboxed)."""
        return self.supervisor.bwrap is None or self._mounts_fd != -1

    def check_guards(self) -> None:
        """End the session if the host has replaced a path it hides or protects: the kernel
        removes a mount from every namespace when the host replaces the path under it (`git
        config` renames a new .git/config into place), and from then on the sandbox would
        show the new file (docs/sandbox.md, "Paths replaced on the host"). `ended_why` says
        so afterwards. Cheap when nothing changed: the kernel flags the sandbox's mountinfo
        as soon as its mount table changes (POLLPRI), and only then is it read again. A
        folder moved away on the host takes its mounts along without changing the table:
        the guarded folders' identities are compared too (a stat each)."""
        fd = self._mounts_fd
        if fd == -1 or self.ended_why is not None or self.closed:
            return
        if self._mounts_poll.poll(0):
            self._guards_lost(_read_all(fd))  # reading re-arms the flag
        if self.ended_why is None:
            moved = [path for path, dev, ino in _identities(self._guard_dirs)
                     if (dev, ino) != self._guard_ids[path]]
            if moved:
                self._end_guards_lost(moved)

    def _guards_lost(self, mountinfo: bytes) -> None:
        points = sandbox.mount_points(mountinfo)
        missing = [p for p in sandbox.guarding_mounts(self._policy) if p not in points]
        if missing:
            self._end_guards_lost(missing)

    def _end_guards_lost(self, paths: list[str]) -> None:
        self.ended_why = (f"{', '.join(paths)} changed on the host while the session ran, "
                          f"and its sandbox no longer hid or protected it")
        log.warning("session %s ended: %s", self.id, self.ended_why)
        self.supervisor.nursery.start_soon(self.close)

    async def _watch_guards_started(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """check_guards every GUARD_CHECK_S, for commands already running. Started (the
        mountinfo open and read) before the session is handed out."""
        try:
            self._mounts_fd = os.open(f"/proc/{self.launcher.host_pid}/mountinfo",
                                      os.O_RDONLY | os.O_CLOEXEC)
            # Made once: every call that starts something asks it.
            self._mounts_poll = select.poll()
            self._mounts_poll.register(self._mounts_fd, select.POLLPRI)
            self._guards_lost(_read_all(self._mounts_fd))  # replaced as the sandbox started
        except OSError as e:
            log.warning("session %s: cannot watch its mounts (%s)", self.id, e)
            task_status.started()
            return
        task_status.started()
        try:
            while not self.closed and self.ended_why is None:
                self.check_guards()
                await trio.sleep(GUARD_CHECK_S)
        finally:
            fd, self._mounts_fd = self._mounts_fd, -1
            os.close(fd)

    def adopt(self, session_id: str) -> None:
        """A warm spare becomes session `session_id` (its scratch folder and cgroup keep
        their names)."""
        self.id = session_id
        self.opened_at = time.time()
        self.activity.restart(trio.current_time())

    def wrapper(self) -> list[str]:
        prefix = self.cgroup.join_argv() if self.cgroup else []
        if self.supervisor.bwrap is None:
            return prefix
        return prefix + sandbox.bwrap_argv(self._policy, bwrap=self.supervisor.bwrap)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The session's task. Reports a start failure through `task_status.started(error)`
        rather than raising it, so the caller gets one plain ToolsdError."""
        os.makedirs(self.scratch, mode=0o700, exist_ok=True)
        if self.home_is_own:
            await trio.to_thread.run_sync(self._make_home)
        places = self.supervisor.cgroup_places
        if places:
            self.cgroup = cgroups.SessionCgroups.create(
                places, self.id, pids=self.limits.pids, memory_mb=self.limits.memory_mb)
            if "memory" in places and not self.cgroup.limits("memory"):
                log.warning("session %s: memory limited by RLIMIT_AS instead", self.id)
                self._set_rlimits(memory_cgroup=False)
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                # The workspace's repositories as they are before any command runs (the
                # baseline of host_exec): looked at while the sandbox starts, and until
                # then no command starts (jobs.spawn_with_pipe waits).
                nursery.start_soon(self._watch_repositories)
                # The folders as the sandbox is about to bind them (see check_guards).
                self._guard_dirs = [p for p in sandbox.guarding_mounts(self._policy)
                                    if os.path.isdir(p)]
                self._guard_ids = {path: (dev, ino) for path, dev, ino
                                   in _identities(self._guard_dirs)}
                try:
                    self.launcher = await Launcher.start(
                        nursery, wrapper=self.wrapper(), env=self.env, cwd=self.workspace,
                        python=sys.executable)
                except LauncherError as e:
                    self.closed = True
                    task_status.started(ToolsdError(
                        SANDBOX_UNAVAILABLE, f"could not start the session's sandbox: {e}"))
                    nursery.cancel_scope.cancel()
                    return
                if self.supervisor.bwrap is None:
                    log.warning("session %s runs unsandboxed: %s", self.id,
                                self.supervisor.why_no_sandbox)
                if self.supervisor.bwrap is not None:
                    await nursery.start(self._watch_guards_started)
                task_status.started(None)
                await self._stop.wait()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                if self.launcher is not None:
                    await self.launcher.aclose()
                if self.cgroup is not None:
                    self.cgroup.remove()
                if self.host_exec_tracker is not None:
                    # Closing an inotify descriptor waits for the kernel's RCU grace period
                    # (milliseconds): not on the event loop.
                    await trio.to_thread.run_sync(self.host_exec_tracker.close)
                await trio.to_thread.run_sync(shutil.rmtree, self.scratch, True)
                await trio.to_thread.run_sync(shutil.rmtree, self.home_dir, True)

    async def close(self):
        """End everything of the session; idempotent (a second caller waits for the first)."""
        if self._closing:
            await self._close_done.wait()
            return self.close_result
        self._closing = True
        self.closed = True
        from toolsd.wire.protocol import SessionCloseResult

        with trio.CancelScope(shield=True):
            repls = 0
            how = f"ended: {self.ended_why}" if self.ended_why else "closed"
            closed = ToolsdError(SESSION_CLOSED, f"session {self.id} was {how}, which stops "
                                 f"everything it runs; open a new session")
            for turn in list(self.turns.values()):
                repls += await self._end_turn(turn, closed)
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
            if self.launcher is not None:
                await self.launcher.aclose()
            self.close_result = result
            self._close_done.set()
        return self.close_result

    def check_open(self) -> None:
        self.check_guards()
        if self.ended_why is not None:
            raise ToolsdError(SESSION_CLOSED, f"session {self.id} was ended: "
                              f"{self.ended_why}; open a new session")
        if self.closed:
            raise ToolsdError(SESSION_CLOSED, f"session {self.id} is closed; open a new session")
        if self.launcher is not None and not self.launcher.alive:
            raise ToolsdError(SESSION_CLOSED, f"session {self.id}'s sandbox has died (the "
                              f"daemon's log says why; session.list shows it as alive: false); "
                              f"close it and open a new session")

    @property
    def alive(self) -> bool:
        """False once the session's sandbox died (killed from the host or from inside, or by
        the kernel), asked now; a closed session is not alive either."""
        return (not self.closed and self.ended_why is None and self.launcher is not None
                and not self.launcher.gone_now())

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

    def keep_active(self, job) -> None:
        """The session is not idle until `job`'s whole tree has ended (a background process,
        with whatever it left running)."""
        self.activity.begin()
        self.nursery.start_soon(self._active_until_done, job)

    async def _active_until_done(self, job) -> None:
        try:
            await job.done.wait()
        finally:
            self.activity.end(trio.current_time())

    def _make_home(self) -> None:
        """The session's home folder as the sandbox binds it at HOME: the host's small
        files copied, and the session's own git config (home.py)."""
        os.makedirs(self.home_dir, mode=0o700, exist_ok=True)
        for folder in self._policy.folders:
            if folder.writable:
                home_folders.copy_into(folder, self.home_dir)
        with open(os.path.join(self.home_dir, home.GIT_CONFIG), "w") as f:
            f.write(home.git_config_text(self.env["HOME"]))

    # ------------------------------------------------------------ host_exec

    async def _watch_repositories(self) -> None:
        try:
            if self.host_exec_tracker is not None:
                await trio.to_thread.run_sync(self.host_exec_tracker.start)
        except Exception:
            # Only a report is lost: the session itself goes on.
            log.exception("session %s: the workspace's repositories are not watched", self.id)
        finally:
            self.repositories_known.set()

    async def take_baseline(self) -> None:
        """What the workspace holds now is what the session found (a sandbox made ahead,
        handed to a session: what changed meanwhile is not this session's doing)."""
        tracker = self.host_exec_tracker
        if tracker is not None and tracker.changed():  # else the baseline is as it was
            async with self._host_exec_lock:
                await trio.to_thread.run_sync(tracker.rebaseline)

    async def host_exec(self) -> list[str]:
        """What the session added that the host's git would execute (hostexec.Tracker): for
        every call's result, looked at when the call is over. One poll when nothing in the
        workspace's folders changed."""
        tracker = self.host_exec_tracker
        if tracker is None:
            return []
        if tracker.changed() and tracker.update_now() is None:
            async with self._host_exec_lock:
                try:
                    await trio.to_thread.run_sync(tracker.update)
                except Exception:
                    # The call's own result stands; the list stays as last looked at.
                    log.exception("session %s: could not look at its repositories", self.id)
        return list(tracker.found)

    async def reported(self, result):
        """`result` with host_exec, looked at now that its call is over: every result of a
        call on a session carries it (left out while there is nothing)."""
        result.host_exec = await self.host_exec() or UNSET
        return result

    def host_exec_now(self) -> list[str] | None:
        """host_exec() without waiting: None when the workspace changed and looking at it
        needs a worker thread (then call host_exec)."""
        tracker = self.host_exec_tracker
        if tracker is None:
            return []
        if tracker.changed() and tracker.update_now() is None:
            return None
        return list(tracker.found)

    def host_exec_known(self) -> list[str]:
        """As of the last look, without looking (session.list)."""
        tracker = self.host_exec_tracker
        return [] if tracker is None else list(tracker.found)

    # ------------------------------------------------------------ memory

    def oom_kills(self) -> int | None:
        """The session's count of processes ended by the kernel's OOM killer (None without a
        memory cgroup): take it before a call, and `memory_note` says afterwards whether
        the call met the memory limit."""
        return self.cgroup.oom_kills() if self.cgroup is not None else None

    def memory_limit_hit(self, oom_kills_before: int | None) -> bool:
        """Whether the OOM killer ended a process of the session since `oom_kills_before`
        was taken."""
        now = self.oom_kills()
        return oom_kills_before is not None and now is not None and now > oom_kills_before

    def memory_note(self, oom_kills_before: int | None) -> str:
        """A line saying that the session's memory limit was reached, if the OOM killer
        ended a process of the session since `oom_kills_before` was taken; else ""."""
        if not self.memory_limit_hit(oom_kills_before):
            return ""
        return (f"[the session's memory limit ({self.limits.memory_mb} MB) was reached: the "
                f"kernel's OOM killer ended a process of the session with SIGKILL while this "
                f"ran; use less memory, or open the session with a larger limits.memory_mb]")

    # ------------------------------------------------------------ turns

    def begin_turn(self) -> str:
        self.check_open()
        turn_id = f"t-{uuid.uuid4().hex[:12]}"
        self.turns[turn_id] = Turn(turn_id)
        return turn_id

    def turn(self, turn_id: str) -> Turn:
        turn = self.turns.get(turn_id)
        if turn is None:
            raise ToolsdError(NOT_FOUND, f"no turn {turn_id!r} in session {self.id}; "
                              f"start one with turn.begin")
        return turn

    async def end_turn(self, turn_id: str) -> int:
        turn = self.turn(turn_id)
        return await self._end_turn(turn)

    async def _end_turn(self, turn: Turn, cut_off: ToolsdError | None = None) -> int:
        """Stop the turn's REPLs; `cut_off` answers the requests they cut off (see
        Repl.aclose)."""
        self.turns.pop(turn.id, None)
        count = 0
        with trio.CancelScope(shield=True):
            for repl in list(turn.repls.values()):
                if await repl.aclose(cut_off):
                    count += 1
        return count

    # ------------------------------------------------------------ paths

    def resolve_cwd(self, cwd: str | None) -> str:
        """A command's folder: inside the workspace (relative paths are taken from it)."""
        if cwd is None or cwd == "":
            return self.workspace
        # Resolved, so a symlink in the workspace cannot point the command (or our isdir
        # check, which runs on the host) somewhere else.
        path = os.path.realpath(os.path.join(self.workspace, cwd))
        if path != self.workspace and not path.startswith(self.workspace + os.sep):
            raise ToolsdError(BAD_PARAMS, f"cwd {cwd!r} is outside the workspace "
                              f"{self.workspace}; give a folder inside it")
        if not os.path.isdir(path):
            raise ToolsdError(BAD_PARAMS, f"cwd {cwd!r} is not an existing folder in the "
                              f"workspace")
        return path

    def command_env(self, extra: dict[str, str]) -> dict[str, str]:
        try:
            env = {**self.env, **sandbox.validate_env(extra)}
            if extra:  # self.env alone was checked at open
                sandbox.check_env_size(env)
        except ValueError as e:
            raise ToolsdError(BAD_PARAMS, str(e)) from None
        return env

    @property
    def shell(self) -> tuple[str, str]:
        """(name, path) of the shell for shell.run: bash, else sh, as the sandbox has them."""
        info = self.launcher.info
        if info.get("bash"):
            return "bash", info["bash"]
        if info.get("sh"):
            return "sh", info["sh"]
        raise ToolsdError(SANDBOX_UNAVAILABLE, "the sandbox has neither bash nor sh on its PATH")
