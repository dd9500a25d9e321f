"""The Supervisor owns every session, and through them every process toolsd started.

Resource handling: sessions run as tasks in the Supervisor's nursery; `aclose()` closes each
session (shielded: SIGTERM, grace, SIGKILL, wait) so that a stopping daemon leaves nothing
behind. Ids come from the state folder and are never reused.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import sys
import time

import trio

from toolsd import __version__
from toolsd.sandbox import cgroups
from toolsd.wire.protocol import NOT_FOUND, SESSION_CLOSED, ToolsdError
from toolsd.sandbox.policy import Limits
from toolsd.daemon.state import StateDir

log = logging.getLogger("toolsd.supervisor")


@dataclasses.dataclass
class Config:
    socket_path: str
    state_dir: str
    max_frame: int
    require_sandbox: bool = False
    hidden: tuple[str, ...] = ()  # more paths to hide from sessions (--hide)
    shown: tuple[str, ...] = ()  # home.SECRETS entries let back into the home (--show)
    limits: Limits = Limits()
    warm_spare: bool = True  # keep a sandbox started ahead for the next session.open
    # Close sessions idle for this long (--idle-timeout; see session.Activity); None: never.
    idle_timeout_s: float | None = None


# A warm spare unused for this long is closed: it would only hold memory, and what its
# launcher found on PATH when it started grows stale.
SPARE_MAX_AGE_S = 300.0
# Why recently ended sessions ended, kept for calls that still name them: at most this many.
ENDED_KEPT = 1000
# How long after a session.open its spare is started: a new session's first commands come
# right away, and a sandbox starting next to them on a small machine slows them down (the
# first shell.run of a session took 8 ms instead of 4 here).
SPARE_DELAY_S = 0.5


@dataclasses.dataclass
class Spare:
    session: object  # a started Session, not registered
    key: tuple
    fingerprint: tuple
    made_at: float


class Supervisor:
    def __init__(self, config: Config, nursery: trio.Nursery, bwrap: str | None, why_not: str):
        self.config = config
        self.nursery = nursery
        self.state = StateDir(config.state_dir)
        self.bwrap = bwrap
        self.why_no_sandbox = why_not
        self.sessions: dict = {}  # session id -> Session
        self.processes: dict = {}  # "bgN" -> BackgroundProcess (alive or finished)
        self.started_at = time.time()
        self.closing = False
        self._spare: Spare | None = None
        self._spare_making = False
        self._spares_made = 0
        self.host_shells = [s for s in ("bash", "sh") if shutil.which(s)]
        self.host_languages = ["python"] + (["node"] if shutil.which("node") else [])
        self._ended: dict[str, str] = {}  # session id -> why toolsd closed it by itself
        self.cgroup_places, why_no_cgroup = cgroups.find_places()
        if "pids" not in self.cgroup_places:
            log.warning("sessions' process counts are limited by RLIMIT_NPROC only, which does "
                        "not bind root: %s", why_no_cgroup["pids"])
        if "memory" in self.cgroup_places:
            log.info("sessions' memory: a memory cgroup per session under %s (limits.memory_mb "
                     "is a session's total)", self.cgroup_places["memory"].folder)
        else:
            log.warning("sessions' memory is limited by RLIMIT_AS (address space, per process) "
                        "only, under which WebAssembly, Go, the JVM and sanitizers may fail: %s",
                        why_no_cgroup["memory"])
        for folder in {place.folder for place in self.cgroup_places.values()}:
            cgroups.remove_stale(folder)
        if config.idle_timeout_s is not None:
            log.info("sessions with no activity for %g s are closed (--idle-timeout)",
                     config.idle_timeout_s)
            nursery.start_soon(self._close_idle_sessions)

    @property
    def sandbox_kind(self) -> str:
        return "bwrap" if self.bwrap else "none"

    @property
    def server_name(self) -> str:
        return f"toolsd {__version__} (python {sys.version.split()[0]})"

    def hidden_paths(self) -> tuple[str, ...]:
        """Folders sandboxed code must never reach: the daemon's own, and --hide ones."""
        socket_dir = os.path.dirname(self.config.socket_path)
        return (socket_dir, self.state.path, *self.config.hidden)

    # ------------------------------------------------------------ sessions

    async def open_session(self, params):
        from toolsd.daemon.session import (  # session imports the launcher; keep startup light
            Session,
        )

        if self.closing:
            raise ToolsdError(SESSION_CLOSED, "toolsd is shutting down; start it again")
        session_id = f"s{self.state.next_id('session')}"
        session = Session(session_id, self, params)
        spare = self._claim_spare(session)
        if spare is not None:
            spare.adopt(session_id)
            await spare.take_baseline()
            session = spare
        else:
            error = await self.nursery.start(session.run)
            if error is not None:
                raise error
        self.sessions[session_id] = session
        self._make_spare_soon(params)
        return session

    # ------------------------------------------------------------ warm spares
    #
    # Starting a sandbox is most of session.open: bwrap and the launcher's Python, some 40 ms
    # here. After each session.open one more sandbox is started for the same parameters and
    # kept unregistered; the next session.open that asks for exactly that sandbox (the same
    # policy, limits, and the same folders at its paths) takes it as it is. An agent opens
    # its sessions on one workspace over and over.

    def _claim_spare(self, session):
        spare, self._spare = self._spare, None
        if spare is None:
            return None
        spare.session.check_guards()  # its own hiding mounts, as for any session
        fits = (not spare.session.closed and spare.session.ended_why is None
                and spare.session.guarded and spare.session.launcher is not None
                and not spare.session.launcher.gone_now()
                and time.monotonic() - spare.made_at < SPARE_MAX_AGE_S
                and spare.key == session.spare_key()
                and spare.fingerprint == session.fingerprint())
        if fits:
            return spare.session
        self.nursery.start_soon(spare.session.close)
        return None

    def _make_spare_soon(self, params) -> None:
        if self.config.warm_spare and not self.closing and not self._spare_making:
            self._spare_making = True
            self.nursery.start_soon(self._make_spare, params)

    async def _make_spare(self, params) -> None:
        from toolsd.daemon.session import Session

        spare = session = None
        try:
            await trio.sleep(SPARE_DELAY_S)
            if self.closing:
                return
            self._spares_made += 1
            session = Session(f"spare{self._spares_made}", self, params)
            fingerprint = session.fingerprint()  # before the sandbox binds anything
            if await self.nursery.start(session.run) is not None:
                return  # it failed to start; the next session.open starts its own
            spare = Spare(session, session.spare_key(), fingerprint, time.monotonic())
            old, self._spare = self._spare, spare
            if old is not None:
                await old.session.close()
        except ToolsdError as e:
            log.debug("no warm spare: %s", e.message)
            return
        except Exception:
            # A spare is only ever a shortcut: whatever went wrong, the daemon stays up and
            # the next session.open starts its own sandbox.
            log.exception("could not make a warm spare sandbox")
            if spare is None and session is not None:
                with trio.CancelScope(shield=True):
                    await session.close()
            return
        finally:
            self._spare_making = False
        if self.closing:
            await self._close_spare()
            return
        await trio.sleep(SPARE_MAX_AGE_S)
        if self._spare is spare:
            await self._close_spare()

    async def _close_spare(self) -> None:
        spare, self._spare = self._spare, None
        if spare is not None:
            await spare.session.close()

    def session(self, session_id: str):
        session = self.sessions.get(session_id)
        if session is None and session_id in self._ended:
            raise ToolsdError(SESSION_CLOSED, f"session {session_id} {self._ended[session_id]}; "
                              f"open a new session")
        if session is None:
            raise ToolsdError(NOT_FOUND, f"no session {session_id!r}; open one with session.open "
                              f"(session.list shows the open ones)")
        if session.closed:
            session.check_open()  # says why, if toolsd ended it
            raise ToolsdError(SESSION_CLOSED, f"session {session_id} is closed; open a new one")
        return session

    async def close_session(self, session_id: str):
        session = self.session(session_id)
        result = await session.close()
        self.sessions.pop(session_id, None)
        return result

    # ------------------------------------------------------------ idle sessions

    async def _close_idle_sessions(self) -> None:
        """Close each session once it has had no activity (session.Activity) for
        idle_timeout_s. Wakes when the next session could be due: activity only ever moves
        a session's due time later, so nothing needs to wake it sooner."""
        timeout = self.config.idle_timeout_s
        while not self.closing:
            now = trio.current_time()
            wake = timeout
            for session in list(self.sessions.values()):
                idle = session.activity.idle_for(now)
                if idle < timeout:
                    wake = min(wake, timeout - idle)
                elif not session.closed:
                    self._forget(session.id, f"was closed after {idle:.0f} s without activity "
                                 f"(toolsd serve --idle-timeout)")
                    log.info("session %s closed: no call and no running process for %.1f s "
                             "(--idle-timeout %g s)", session.id, idle, timeout)
                    self.nursery.start_soon(session.close)
            await trio.sleep(wake)

    def _forget(self, session_id: str, why: str) -> None:
        """Drop a session from the registry, keeping why for calls that still name it."""
        self.sessions.pop(session_id, None)
        self._ended[session_id] = why
        while len(self._ended) > ENDED_KEPT:
            del self._ended[next(iter(self._ended))]

    def process(self, process_id: str):
        proc = self.processes.get(process_id)
        if proc is None:
            raise ToolsdError(NOT_FOUND, f"no background process {process_id!r}; "
                              f"process.list shows the known ones")
        return proc

    async def aclose(self) -> None:
        """Close every session (each shielded inside), then stop the nursery."""
        self.closing = True
        with trio.CancelScope(shield=True):
            async with trio.open_nursery() as n:
                n.start_soon(self._close_spare)
                for session in list(self.sessions.values()):
                    n.start_soon(session.close)
        self.sessions.clear()
        try:
            self.state.close()
        except OSError as e:
            log.warning("could not write the id counters back (%s); the next daemon skips "
                        "the ids this one reserved", e)
