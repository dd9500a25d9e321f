"""A session's lifecycle: one state, and the moves allowed between states (no I/O).

    STARTING --> OPEN --> ENDED --+--> CLOSING --> CLOSED
        |          \\____________/|
        +--> FAILED -------------/

Whether a session can run a call is asked in one way, `refusal`: None, or why not.
"""

from __future__ import annotations

import enum

__all__ = ["SessionLife", "MOVES", "refusal"]


class SessionLife(enum.Enum):
    STARTING = "starting"  # made; its sandbox is starting
    OPEN = "open"  # its sandbox runs: calls may use it
    FAILED = "failed"  # its sandbox did not start; close() removes what was made
    ENDED = "ended"  # toolsd ended it by itself (a guarded path replaced); close() follows
    CLOSING = "closing"  # close() runs: nothing new starts, what runs is being stopped
    CLOSED = "closed"  # everything of it is gone


MOVES: dict[SessionLife, frozenset[SessionLife]] = {
    SessionLife.STARTING: frozenset({SessionLife.OPEN, SessionLife.FAILED, SessionLife.ENDED,
                                     SessionLife.CLOSING}),
    SessionLife.OPEN: frozenset({SessionLife.ENDED, SessionLife.CLOSING}),
    SessionLife.FAILED: frozenset({SessionLife.CLOSING}),
    SessionLife.ENDED: frozenset({SessionLife.CLOSING}),
    SessionLife.CLOSING: frozenset({SessionLife.CLOSED}),
    SessionLife.CLOSED: frozenset(),
}


def refusal(session_id: str, life: SessionLife, ended_why: str | None,
            sandbox_dead: bool) -> str | None:
    """Why session `session_id` cannot run a call now (a session_closed message that says
    what to do), or None if it can."""
    if ended_why is not None:
        return f"session {session_id} was ended: {ended_why}; open a new session"
    if life is SessionLife.STARTING:
        return f"session {session_id} is still starting; wait for session.open to answer"
    if life is not SessionLife.OPEN:
        return f"session {session_id} is closed; open a new session"
    if sandbox_dead:
        return (f"session {session_id}'s sandbox has died (the daemon's log says why; "
                f"session.list shows it as alive: false); close it and open a new session")
    return None
