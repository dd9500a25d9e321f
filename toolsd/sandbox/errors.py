"""How the sandbox layer fails: its own errors, which the tool boundary turns into the
contract's error replies in one place (toolsd/tools/wire_errors.py).

    SandboxError           what a caller asked of a sandbox failed; `fault` says how, the
                           message (for users) says what happened and what to do
    LauncherError          a start or spawn through the launcher failed (Sandbox.spawn rewords it
     +-- LauncherLimit     as a SandboxError); a resource limit of the session refused it
     +-- LauncherDied      the launcher is gone; nothing more can be spawned or reported
"""

from __future__ import annotations

import enum


class Fault(enum.Enum):
    """How a request of the sandbox failed: whose move it is next."""
    # What was asked is not allowed, or makes no sense here: the caller changes the request.
    REFUSED = "refused"
    # What the request names is not there in the session's view.
    NOT_FOUND = "not_found"
    # A limit of the session refused it: wait, stop something, or ask for less.
    LIMIT = "limit"
    # The session's sandbox is gone: open a new session.
    CLOSED = "closed"
    # The sandbox, or a helper in it, could not be made on this machine.
    UNAVAILABLE = "unavailable"
    # The file system failed the operation (or a helper died during it): try again.
    IO = "io"


class SandboxError(Exception):
    """A request of the sandbox failed; `message` says what happened and what to do."""

    def __init__(self, fault: Fault, message: str):
        super().__init__(message)
        self.fault = fault
        self.message = message


class LauncherError(Exception):
    """A start or spawn failed; the message says what happened and what to do."""


class LauncherLimit(LauncherError):
    """A resource limit of the session (its pids, say) refused a spawn."""


class LauncherDied(LauncherError):
    """The launcher's channel closed while waiting (the launcher was killed or exited)."""
