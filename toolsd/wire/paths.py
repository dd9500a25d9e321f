"""Where the socket and the state folder live (PROTOCOL.md, "Transport and framing")."""

from __future__ import annotations

import os


def default_socket_path(environ: dict[str, str] | None = None) -> str:
    """--socket, else $TOOLSD_SOCKET, else $XDG_RUNTIME_DIR/toolsd/toolsd.sock, else
    /tmp/toolsd-$UID/toolsd.sock. (The --socket part is the caller's.)"""
    env = os.environ if environ is None else environ
    if env.get("TOOLSD_SOCKET"):
        return os.path.abspath(env["TOOLSD_SOCKET"])
    if env.get("XDG_RUNTIME_DIR"):
        return os.path.join(env["XDG_RUNTIME_DIR"], "toolsd", "toolsd.sock")
    return f"/tmp/toolsd-{os.getuid()}/toolsd.sock"


def resolve_socket_path(arg: str | None) -> str:
    return os.path.abspath(arg) if arg else default_socket_path()


def default_state_dir(socket_path: str) -> str:
    """Beside the socket: what must survive a restart (process id counter, logs)."""
    return os.path.join(os.path.dirname(socket_path), "state")

