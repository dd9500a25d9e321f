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
from typing import Iterator

import msgspec
import trio

from toolsd import __version__
from toolsd.daemon import workspaces
from toolsd.daemon.egress import EgressHost
from toolsd.daemon.session import Session
from toolsd.daemon.spares import SparePool
from toolsd.daemon.state_folder import StateDir
from toolsd.daemon.tenants import LOCAL
from toolsd.sandbox.bwrap.guards import GuardRounds
from toolsd.sandbox.launch import cgroups
from toolsd.sandbox.bwrap.policy import Limits
from toolsd.tools.host import Host
from toolsd.tools.interpreter import STARTS_AT_ONCE
from toolsd.tools.ports import PortForwards
from toolsd.tools.repl_priority import StartPriority
from toolsd.tools.process_table import ProcessTable
from toolsd.wire.protocol import (
    FEATURES,
    NOT_FOUND,
    SESSION_CLOSED,
    HelloResult,
    SessionCloseResult,
    SessionOpenParams,
    ToolsdError,
)

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
    # REPL interpreters starting at once, across sessions (--interpreter-starts); None:
    # tools/interpreter.py's STARTS_AT_ONCE.
    interpreter_starts: int | None = None
    # Close sessions idle for this long (--idle-timeout; see activity.Activity); None: never.
    idle_timeout_s: float | None = None
    forward_binds: tuple[str, ...] = ()  # port.forward's binds beyond loopback (--forward-bind)
    # Where sessions opened without a workspace get theirs (--work-root); None: workspaces/
    # in the state folder (see workspaces.py).
    work_root: str | None = None
    # TCP with TLS (remote_setup.py, tls_serve.py): --listen URLs, --tls-cert/--tls-key,
    # --tokens.
    listen: tuple[str, ...] = ()
    tls_cert: str | None = None
    tls_key: str | None = None
    tokens_file: str | None = None
    test_resolver: str | None = None  # tests only: names resolved from this file (egress)


# Why recently ended sessions ended, kept for calls that still name them: at most this many.
ENDED_KEPT = 1000


class Supervisor:
    def __init__(self, config: Config, nursery: trio.Nursery, bwrap: str | None, why_not: str):
        self.config = config
        self.nursery = nursery
        self.state = StateDir(config.state_dir)
        self.egress = EgressHost(self.state.path, config.test_resolver)
        self.sessions: dict[str, Session] = {}
        # Every background process, by id and by session (ids from the state folder).
        self.processes = ProcessTable(lambda: f"bg{self.state.next_id('process')}",
                                      self.state.logs)
        self.forwards = PortForwards(config.forward_binds)  # every session's port.forward
        self.started_at = time.time()
        self.closing = False
        self.spares = SparePool(self)
        self.host_shells = [s for s in ("bash", "sh") if shutil.which(s)]
        self.host_languages = ["python"] + (["node"] if shutil.which("node") else [])
        self._hello: dict[str, msgspec.Raw] = {}  # tenant -> hello's result (hello_result)
        # session id -> (why toolsd closed it by itself, its tenant)
        self._ended: dict[str, tuple[str, str]] = {}
        self.work_root = config.work_root or self.state.workspaces
        cgroup_places, why_no_cgroup = cgroups.find_places()
        if "pids" not in cgroup_places:
            log.warning("sessions' process counts are limited by RLIMIT_NPROC only, which does "
                        "not bind root: %s", why_no_cgroup["pids"])
        if "memory" in cgroup_places:
            log.info("sessions' memory: a memory cgroup per session under %s (limits.memory_mb "
                     "is a session's total)", cgroup_places["memory"].folder)
        else:
            log.warning("sessions' memory is limited by RLIMIT_AS (address space, per process) "
                        "only, under which WebAssembly, Go, the JVM and sanitizers may fail: %s",
                        why_no_cgroup["memory"])
        for folder in {place.folder for place in cgroup_places.values()}:
            cgroups.remove_stale(folder)
        # What every session and tool reads of the host, found once.
        starts = trio.CapacityLimiter(config.interpreter_starts or STARTS_AT_ONCE)
        self.host = Host(
            max_frame=config.max_frame, limits=config.limits, shown=config.shown, bwrap=bwrap,
            why_no_sandbox=why_not, cgroup_places=cgroup_places,
            hidden_paths=self._hidden_paths(), scratch=self.state.scratch,
            logs=self.state.logs, start_priority=StartPriority.find(),
            interpreter_starts=starts, guard_rounds=GuardRounds())
        nursery.start_soon(self.host.guard_rounds.run)
        if config.idle_timeout_s is not None:
            log.info("sessions with no activity for %g s are closed (--idle-timeout)",
                     config.idle_timeout_s)
            nursery.start_soon(self._close_idle_sessions)

    @property
    def warm_spare(self) -> bool:
        """Whether a sandbox is made ahead for the next session.open (spares.py)."""
        return self.config.warm_spare

    @property
    def server_name(self) -> str:
        return f"toolsd {__version__} (python {sys.version.split()[0]})"

    def hello_result(self, tenant: str) -> msgspec.Raw:
        """What hello answers `tenant`, encoded once: all of it is found at start and stays
        while the daemon runs, and a reply carries the encoded bytes as they are (one entry
        per tenant that ever said hello)."""
        result = self._hello.get(tenant)
        if result is None:
            result = self._hello[tenant] = msgspec.Raw(msgspec.msgpack.encode(HelloResult(
                protocol=1, server=self.server_name, sandbox=self.host.sandbox_kind,
                shells=self.host_shells, languages=self.host_languages,
                max_frame=self.config.max_frame, features=list(FEATURES), tenant=tenant)))
        return result

    def _hidden_paths(self) -> dict[str, str]:
        """Folders sandboxed code must never reach, the daemon's own and --hide ones: {path:
        what it is, in words, for the message that refuses such a workspace}."""
        named = {os.path.dirname(self.config.socket_path): "toolsd's socket folder",
                 self.state.path: "toolsd's state folder",
                 self.work_root: "toolsd's work root (the workspaces it makes for sessions)"}
        for path in self.config.hidden:
            named.setdefault(path, "hidden by toolsd serve --hide")
        # What lets a client in, where given outside the state folder and --hide folders: a
        # session of one tenant would read the others' tokens (or the TLS key) from the
        # read-only root. (A file hidden alone is a mount on it: replacing it on the host
        # ends open sessions, docs/remote.md; a folder of its own given to --hide does not.)
        for path, what in ((self.config.tokens_file, "toolsd's tokens file (--tokens)"),
                           (self.config.tls_key, "toolsd's TLS key (--tls-key)")):
            if path and not any(_inside(os.path.abspath(path), h) for h in named):
                named[os.path.abspath(path)] = what
        return named

    # ------------------------------------------------------------ sessions

    async def open_session(self, params: SessionOpenParams, tenant: str = LOCAL) -> Session:
        if self.closing:
            raise ToolsdError(SESSION_CLOSED, "toolsd is shutting down; start it again")
        session_id = f"s{self.state.next_id('session')}"
        made = params.workspace is None
        if made:  # its own folder, which Session.run removes at close
            params = msgspec.structs.replace(
                params, workspace=workspaces.make(self.work_root, session_id))
        try:
            session = Session(session_id, self, params, made_workspace=made)
        except BaseException:
            if made:
                workspaces.remove(params.workspace)
            raise
        session.tenant = tenant
        spare = self.spares.claim(session) if not made else None
        if spare is not None:
            spare.adopt(session_id)
            spare.tenant = tenant
            await spare.repositories.rebaseline()
            session = spare
        else:
            error = await self.nursery.start(session.run)
            if error is not None:
                raise error
        self.sessions[session_id] = session
        if not made:  # a made folder is never asked for again: no spare for it
            self.spares.make_soon(params)
        return session

    def session(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None and session_id in self._ended:
            raise ToolsdError(SESSION_CLOSED, f"session {session_id} "
                              f"{self._ended[session_id][0]}; open a new session")
        if session is None:
            raise ToolsdError(NOT_FOUND, self.unknown_session(session_id))
        why = session.refusal(sandbox=False)  # a dead sandbox's session can still be closed
        if why is not None:
            raise ToolsdError(SESSION_CLOSED, why)
        return session

    async def close_session(self, session_id: str) -> SessionCloseResult | None:
        session = self.session(session_id)
        result = await session.close()
        self.sessions.pop(session_id, None)
        return result

    # ------------------------------------------------------------ idle sessions

    async def _close_idle_sessions(self) -> None:
        """Close each session once it has had no activity (activity.Activity) for
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
        session = self.sessions.pop(session_id, None)
        self._ended[session_id] = (why, session.tenant if session is not None else LOCAL)
        while len(self._ended) > ENDED_KEPT:
            del self._ended[next(iter(self._ended))]

    def ended_tenant(self, session_id: str) -> str | None:
        ended = self._ended.get(session_id)
        return ended[1] if ended is not None else None

    @staticmethod
    def unknown_session(session_id: str) -> str:
        return (f"no session {session_id!r}; open one with session.open (session.list shows "
                f"the open ones)")

    @staticmethod
    def unknown_process(process_id: str) -> str:
        return f"no background process {process_id!r}; process.list shows the known ones"

    def open_sessions(self) -> Iterator[Session]:
        return (s for s in self.sessions.values() if not s.closed)

    async def aclose(self) -> None:
        """Close every session (each shielded inside), then stop the nursery."""
        self.closing = True
        with trio.CancelScope(shield=True):
            async with trio.open_nursery() as n:
                n.start_soon(self.spares.aclose)
                for session in list(self.sessions.values()):
                    n.start_soon(session.close)
        self.sessions.clear()
        try:
            self.state.close()
        except OSError as e:
            log.warning("could not write the id counters back (%s); the next daemon skips "
                        "the ids this one reserved", e)


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")
