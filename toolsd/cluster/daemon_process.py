"""One node's `toolsd serve`: its folder, its command line, its tokens file. No Ray.

A node's folder (under the cluster root) holds `state/` (the daemon's state folder: the id
counters that never go back, so `bg3` or `s12` never names something new after a restart),
`s.sock` (its Unix socket, for the agent alone) and `tokens` (0600): a line for the agent's
own tenant and one per open lease. The agent rewrites the file (a temporary file, then a
rename) to add or withdraw a lease's token; the daemon reads it again when it changes
(toolsd/daemon/tokens.py, TokenFile).
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import signal
import sys

__all__ = ["NodeFiles", "serve_argv", "die_with_parent"]

AGENT_TENANT = "toolsd-agent"


class NodeFiles:
    def __init__(self, folder: str):
        self.folder = folder
        os.makedirs(folder, mode=0o700, exist_ok=True)
        self.state = os.path.join(folder, "state")
        self.socket = os.path.join(folder, "s.sock")
        self.tokens = os.path.join(folder, "tokens")
        self._agent_token = secrets.token_urlsafe(32)

    def write_tokens(self, leases: dict[str, str]) -> None:
        """The tokens file with the agent's line and `leases` (tenant -> token)."""
        lines = [f"{AGENT_TENANT} {self._agent_token}"]
        lines += [f"{tenant} {token}" for tenant, token in sorted(leases.items())]
        tmp = self.tokens + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(tmp, self.tokens)

    def remote_info(self) -> dict:
        """What the daemon wrote at start: its URLs and fingerprint (remote.json)."""
        with open(os.path.join(self.state, "remote.json")) as f:
            return json.load(f)


def serve_argv(files: NodeFiles, host: str, port: int, extra: list[str]) -> list[str]:
    host_text = f"[{host}]" if ":" in host else host
    return [sys.executable, "-m", "toolsd", "serve", "--socket", files.socket,
            "--state-dir", files.state, "--listen", f"tls://{host_text}:{port}",
            "--tokens", files.tokens, *extra]


def die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the agent's process dies (its node was
    removed, or Ray killed it), so no daemon outlives its agent; its sandboxes follow it
    (bubblewrap's --die-with-parent)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
