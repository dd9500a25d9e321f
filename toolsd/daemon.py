"""`toolsd serve`: bring the daemon up, serve until SIGTERM/SIGINT, then end everything.

Shutdown order: stop accepting, remove the socket, close every session (each ends its
processes and REPLs: SIGTERM, grace, SIGKILL), exit 0.
"""

from __future__ import annotations

import fcntl
import logging
import os
import resource
import signal
import sys

import trio

from toolsd import server
from toolsd.state import StateInUse, ensure_private_dir
from toolsd.supervisor import Config, Supervisor
from toolsd.sandbox.probe import probe_bwrap

log = logging.getLogger("toolsd")


class StartupError(Exception):
    """The daemon cannot start; the message says why and what to do."""


def take_lock(socket_path: str) -> int:
    """One daemon per socket: an flock beside the socket, released by the kernel if we die."""
    lock_path = socket_path + ".lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StartupError(f"another toolsd is already serving on {socket_path}; stop it first "
                           f"(toolsd status --socket {socket_path}) or pass another --socket")
    return fd


def raise_open_files_limit() -> None:
    """Our soft RLIMIT_NOFILE up to the hard limit: each session holds a few descriptors and
    each connection one, and the usual soft limit of 1024 would cap a daemon at a few hundred
    sessions. Sandboxed commands do not inherit it: the launcher sets the session's own limit
    (Limits.nofile) on every command it starts."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        # The kernel refuses an infinite soft limit for open files: its ceiling is nr_open.
        try:
            with open("/proc/sys/fs/nr_open") as f:
                target = int(f.read())
        except (OSError, ValueError):
            return
    if soft == resource.RLIM_INFINITY or soft >= target:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError) as e:
        log.warning("could not raise the open files limit from %d to %d (%s); the daemon may "
                    "run out of descriptors with many sessions", soft, target, e)


def run(config: Config, *, announce=print) -> None:
    raise_open_files_limit()
    ensure_private_dir(os.path.dirname(config.socket_path))
    lock_fd = take_lock(config.socket_path)
    bwrap, why_not = probe_bwrap()
    if bwrap is None:
        if config.require_sandbox:
            raise StartupError(f"--require-sandbox: no sandbox is possible here: {why_not}")
        log.warning("sessions will run UNSANDBOXED (sandbox: none): %s", why_not)
    try:
        trio.run(_main, config, bwrap, why_not, announce)
    finally:
        os.close(lock_fd)


async def _main(config: Config, bwrap, why_not: str, announce) -> None:
    try:
        sock = server.bind_socket(config.socket_path)
    except server.AlreadyServing as e:
        raise StartupError(str(e)) from None
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            try:
                supervisor = Supervisor(config, nursery, bwrap, why_not)
            except StateInUse as e:
                sock.close()
                _unlink(config.socket_path)
                raise StartupError(str(e)) from None
            # Connections live in the accepting nursery: cancelling it stops accepting and
            # cancels every in-flight request (sessions are the supervisor's, not theirs).
            async with trio.open_nursery() as accepting:
                await accepting.start(server.serve, supervisor, sock, config.max_frame)
                announce(f"toolsd listening on {config.socket_path} "
                         f"(sandbox: {supervisor.sandbox_kind})", flush=True)
                announce(f"try: toolsd --socket {config.socket_path} exec -- echo hello",
                         flush=True)
                async for signum in signals:
                    log.info("%s: shutting down", signal.Signals(signum).name)
                    break
                accepting.cancel_scope.cancel()
            sock.close()
            _unlink(config.socket_path)
            await supervisor.aclose()
            nursery.cancel_scope.cancel()


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
