"""The toolsd daemon that `toolsd agent` and `toolsd mcp` talk to: the one answering on the
socket, or else one of their own, for this run only.

A person who never ran `toolsd serve` should still get a working agent. When no daemon answers
on the socket (`--socket`, `$TOOLSD_SOCKET`, the default path), `toolsd_socket()` starts one in
a private folder (its socket and state inside) and stops it when the run ends. It is never
left behind: a daemon shared between runs, with processes that outlive them and `toolsd ps`
to see them, is what `toolsd serve` is for. The daemon of a run is started

- in a session of its own (setsid), so that Ctrl-C at the terminal reaches the agent, which
  cancels its turn, and not the daemon, which would end every session at once;
- with a parent-death signal (SIGTERM), so that it ends its sessions and exits even when the
  agent is killed; its sandboxes follow it (bwrap's --die-with-parent);
- without a warm spare: a run opens one session, and a spare would be a sandbox for nothing.

Only the command line of the daemon is used here (`python -m toolsd serve`): agent/ talks to
the daemon through the client, never by importing it.

Resource handling: an `OwnDaemon` owns its process, the pipe of its first lines and its
folder (under $TMPDIR); `close()` stops the process (SIGTERM: every session of it ends) and
removes the folder. A run killed with SIGKILL cannot remove it: its processes end all the
same, the folder (the daemon's log and id counters) stays.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import IO

from toolsd.client import Client
from toolsd.client.remote import Target, target_from_options

__all__ = ["OwnDaemon", "DaemonFailed", "answers", "toolsd_socket", "daemon_target"]

PR_SET_PDEATHSIG = 1
STOP_WAIT_S = 60.0  # closing sessions ends their processes: TERM, a grace, then KILL
PROBE_TIMEOUT_S = 10.0


class DaemonFailed(Exception):
    """The daemon of this run could not start; the message says why."""


def answers(socket_path: str) -> bool:
    """Whether a toolsd daemon answers `hello` on `socket_path`."""
    try:
        with Client(socket_path, timeout=PROBE_TIMEOUT_S) as c:
            c.hello("toolsd-agent")
        return True
    except Exception:  # nothing there, a stale file, or something that is not toolsd
        return False


class OwnDaemon:
    """A daemon started for this run (see the module). `stderr`: where its log goes (a file
    object or descriptor); by default a file in its folder, shown if it fails to start."""

    def __init__(self, folder: str, proc: subprocess.Popen, log: IO[bytes] | None):
        self.folder = folder
        self.socket = os.path.join(folder, "toolsd.sock")
        self.proc = proc
        self._log = log

    @classmethod
    def start(cls, stderr: IO | int | None = None) -> OwnDaemon:
        folder = tempfile.mkdtemp(prefix="toolsd-run-")
        socket_path = os.path.join(folder, "toolsd.sock")
        log = open(os.path.join(folder, "daemon.log"), "ab") if stderr is None else None
        die_with_parent = _parent_death_signal(signal.SIGTERM)
        try:
            proc = subprocess.Popen(
                # -P: `-m` would put the current folder (the person's workspace, which
                # the sandbox writes) first on sys.path of this unsandboxed daemon.
                [sys.executable, "-P", "-m", "toolsd", "serve", "--socket", socket_path,
                 "--no-warm-spare"],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=log if log is not None else stderr,
                start_new_session=True, preexec_fn=die_with_parent)
        except BaseException:
            if log is not None:
                log.close()
            shutil.rmtree(folder, ignore_errors=True)
            raise
        daemon = cls(folder, proc, log)
        try:
            # The daemon prints its first line once the socket accepts: wait on that.
            first = proc.stdout.readline().decode(errors="replace")
            if "listening on" not in first:
                proc.wait()
                raise DaemonFailed(f"toolsd serve exited ({proc.returncode}) before it listened"
                                   f"{daemon._log_tail()}")
        except BaseException:
            daemon.close()
            raise
        return daemon

    def _log_tail(self) -> str:
        if self._log is None:
            return "; its log is above"
        try:
            with open(self._log.name, "rb") as f:
                text = f.read()[-2000:].decode(errors="replace").strip()
        except OSError:
            return ""
        return f": {text}" if text else ""

    def close(self) -> None:
        """Stop the daemon (its sessions end) and remove its folder. Idempotent."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=STOP_WAIT_S)
                except subprocess.TimeoutExpired:
                    self.proc.kill()  # its sandboxes die with it (--die-with-parent)
                    self.proc.wait()
        finally:
            # The pipe stays open until the daemon is gone: a closed one would break a
            # late line of it.
            self.proc.stdout.close()
            if self._log is not None:
                self._log.close()
            shutil.rmtree(self.folder, ignore_errors=True)


def _parent_death_signal(sig: int) -> Callable[[], None]:
    """A preexec_fn: the child gets `sig` when this process dies (and exits at once if it
    already has). libc is loaded here, before the fork."""
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def daemon_target(args) -> Target:
    """The daemon the command line names (`--url` and its options, `--socket`, or the
    environment: toolsd.client.remote); ValueError says what is wrong."""
    return target_from_options(
        getattr(args, "url", None), getattr(args, "socket", None),
        getattr(args, "token_file", None), getattr(args, "fingerprint", None),
        getattr(args, "ca_file", None))


@contextlib.contextmanager
def toolsd_socket(target: Target, say: Callable[[str], None],
                  stderr: IO | int | None = None) -> Iterator[str | Target]:
    """The daemon to use for the block: a remote one (tls://) as it is; the one answering on
    the target's socket; else one started for the block (`say` tells the person), stopped
    at its end. Call it before any thread is started (the daemon is spawned with a
    preexec_fn)."""
    if target.tls:  # another machine's: never one of our own in its place
        yield target
        return
    path = target.where
    if answers(path):
        yield path
        return
    own = OwnDaemon.start(stderr)
    try:
        say(f"no toolsd answers on {path}; started one for this run only (stopped at exit; "
            f"`toolsd serve` runs one that lasts)")
        yield own.socket
    finally:
        own.close()
