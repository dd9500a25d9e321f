"""How a start or spawn through the sandbox launcher fails.

    LauncherError          a start or spawn failed; the message is for users
     +-- LauncherLimit     a resource limit of the session refused it
     +-- LauncherDied      the launcher is gone; nothing more can be spawned or reported
"""

from __future__ import annotations


class LauncherError(Exception):
    """A start or spawn failed; the message says what happened and what to do."""


class LauncherLimit(LauncherError):
    """A resource limit of the session (its pids, say) refused a spawn."""


class LauncherDied(LauncherError):
    """The launcher's channel closed while waiting (the launcher was killed or exited)."""
