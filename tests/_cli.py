"""Running `toolsd` as a person would, for the CLI's tests: a subprocess on the test daemon's
socket and environment, or at a terminal (pexpect)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pexpect

# Safety net against a hung command, not a timing assertion.
STUCK_S = 60


def toolsd(daemon, *args: str, socket: str | None = None, cwd: str | None = None,
           env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "toolsd", "--socket", socket or daemon.socket, *args],
        capture_output=True, text=True, timeout=STUCK_S, env=env or daemon.env,
        cwd=cwd or daemon.workspace, stdin=subprocess.DEVNULL)


def toolsd_at_terminal(daemon, *args: str, socket: str | None = None,
                       env: dict | None = None) -> pexpect.spawn:
    # Ctrl-C at its default, as a shell starts a program in the foreground.
    return pexpect.spawn(
        sys.executable, ["-m", "toolsd", "--socket", socket or daemon.socket, *args],
        env=env or daemon.env, cwd=daemon.workspace, encoding="utf-8", timeout=STUCK_S,
        dimensions=(24, 200), preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
