"""What the daemon found about its host when it started, the same for every session: built
once (Supervisor) and handed down to sessions and tools as a value."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

from toolsd.sandbox.launch import cgroups
from toolsd.sandbox.bwrap.policy import Limits
from toolsd.tools.repl_priority import StartPriority

if TYPE_CHECKING:
    import trio

    from toolsd.sandbox.bwrap.guards import GuardRounds


@dataclasses.dataclass(frozen=True)
class Host:
    max_frame: int  # the largest frame a reply may be (--max-frame)
    limits: Limits  # a session's limits where session.open names none
    shown: tuple[str, ...]  # home.SECRETS entries let back into the home (--show)
    bwrap: str | None  # the sandbox's bubblewrap; None: sessions run unsandboxed
    why_no_sandbox: str
    cgroup_places: Mapping[str, cgroups.Place]  # controller -> where sessions' cgroups go
    # Folders sandboxed code must never reach: {path: what it is, in words}.
    hidden_paths: Mapping[str, str]
    scratch: str  # the state folder's: a session's /tmp is a folder in it
    logs: str  # the state folder's: background processes' logs
    start_priority: StartPriority  # a starting interpreter's (repl_priority.py)
    # Not a fact but one for every session: how many interpreters may be starting at once,
    # across sessions (tools/interpreter.py, STARTS_AT_ONCE).
    interpreter_starts: trio.CapacityLimiter
    # Likewise: the one task that checks every session's mount guard (guards.py).
    guard_rounds: GuardRounds

    @property
    def sandbox_kind(self) -> str:
        return "bwrap" if self.bwrap else "none"
