"""Who may touch what (PROTOCOL.md 1.2, "tenants"): the one ownership check.

Every connection has a tenant: a TCP connection the one its token names, a Unix-socket peer
LOCAL, the machine's owner, who sees everything. A session belongs to the tenant that opened
it, and its turns and processes with it. Another tenant's id gets exactly the reply of an id
that never existed (`not_found`, the same message), so ids cannot be probed.

The dispatch table says, per method, which id its params carry (`Scope`); `check` runs
before the handler, so a handler never sees a foreign id. The listings filter with
`visible`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

from toolsd.tools import process_names
from toolsd.wire.protocol import NOT_FOUND, ToolsdError

if TYPE_CHECKING:
    from toolsd.daemon.session import Session
    from toolsd.tools.background_process import BackgroundProcess

__all__ = ["LOCAL", "Scope", "check", "visible", "session_tenant"]

LOCAL = "local"


class Scope(enum.Enum):
    """Which id of a method's params names what it touches."""

    NONE = "none"  # nothing of a session (hello, session.open, the listings filter)
    SESSION = "session"  # params.session (None: no session named, as process.list allows)
    PROCESS = "process"  # params.id, a background process


def visible(tenant: str, owner: str) -> bool:
    return tenant == LOCAL or tenant == owner


class Registry(Protocol):
    """Where the check looks ids up (the Supervisor): a Protocol, so that tenants.py never
    imports the Supervisor that imports it."""

    @property
    def sessions(self) -> Mapping[str, Session]: ...

    @property
    def processes(self) -> Iterable[BackgroundProcess]: ...

    def ended_tenant(self, session_id: str) -> str | None: ...

    def unknown_session(self, session_id: str) -> str: ...


def session_tenant(sup: Registry, session_id: str) -> str | None:
    """The tenant of an open or recently ended session; None for an id nobody knows."""
    session = sup.sessions.get(session_id)
    if session is not None:
        return session.tenant
    return sup.ended_tenant(session_id)


def check(sup: Registry, tenant: str, scope: Scope, params: object) -> None:
    """Raise not_found, worded as for an unknown id, when `params` name another tenant's
    session or process."""
    if tenant == LOCAL or scope is Scope.NONE:
        return
    if scope is Scope.SESSION:
        session_id = params.session
        if session_id is not None and session_tenant(sup, session_id) != tenant:
            raise ToolsdError(NOT_FOUND, sup.unknown_session(session_id))
    elif scope is Scope.PROCESS:
        # An id or a name (process_names), looked for among the tenant's own processes
        # only; the handler then gets the id, so a name never reaches another's process.
        own = (bg for bg in sup.processes if bg.session.tenant == tenant)
        params.id = process_names.by_name_or_id(own, params.id, params.session).id
