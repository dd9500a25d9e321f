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
import subprocess
import sys
import time

import trio

from . import __version__, cgroups
from .protocol import NOT_FOUND, SESSION_CLOSED, ToolsdError
from .sandbox import Limits
from .state import StateDir

log = logging.getLogger("toolsd.supervisor")


@dataclasses.dataclass
class Config:
    socket_path: str
    state_dir: str
    max_frame: int
    require_sandbox: bool = False
    hidden: tuple[str, ...] = ()  # more paths to hide from sessions (--hide)
    limits: Limits = Limits()


def probe_bwrap() -> tuple[str | None, str]:
    """(path to bwrap or None, why not). Runs bwrap once with the namespaces sessions use:
    present is not enough (user namespaces may be off, or a container may forbid them)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return None, "bubblewrap (bwrap) is not installed; apt-get install bubblewrap"
    argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--", "/bin/true"]
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"bwrap could not run: {e}"
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip() or f"exit code {proc.returncode}"
        return None, f"bwrap cannot create a sandbox here: {err}"
    return bwrap, ""


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
        self.host_shells = [s for s in ("bash", "sh") if shutil.which(s)]
        self.host_languages = ["python"] + (["node"] if shutil.which("node") else [])
        self.cgroup_root, why_no_cgroup = cgroups.find_root()
        if self.cgroup_root is None:
            log.warning("sessions' process counts are limited by RLIMIT_NPROC only, which does "
                        "not bind root: %s", why_no_cgroup)
        else:
            cgroups.remove_stale(self.cgroup_root)

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
        from .session import Session  # session imports the launcher; keep startup light

        if self.closing:
            raise ToolsdError(SESSION_CLOSED, "toolsd is shutting down; start it again")
        session_id = f"s{self.state.next_id('session')}"
        session = Session(session_id, self, params)
        error = await self.nursery.start(session.run)
        if error is not None:
            raise error
        self.sessions[session_id] = session
        return session

    def session(self, session_id: str):
        session = self.sessions.get(session_id)
        if session is None:
            raise ToolsdError(NOT_FOUND, f"no session {session_id!r}; open one with session.open "
                              f"(session.list shows the open ones)")
        if session.closed:
            raise ToolsdError(SESSION_CLOSED, f"session {session_id} is closed; open a new one")
        return session

    async def close_session(self, session_id: str):
        session = self.session(session_id)
        result = await session.close()
        self.sessions.pop(session_id, None)
        return result

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
                for session in list(self.sessions.values()):
                    n.start_soon(session.close)
        self.sessions.clear()
        try:
            self.state.close()
        except OSError as e:
            log.warning("could not write the id counters back (%s); the next daemon skips "
                        "the ids this one reserved", e)
