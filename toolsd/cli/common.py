"""What every subcommand that talks to the daemon needs: its socket, a connected Client, and
the one rule for a daemon of its own.

Every Client of the CLI is made by `connect` (one place to change how the CLI reaches a
daemon)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from toolsd.client import Client
from toolsd.wire.paths import resolve_socket_path


class CommandFailed(Exception):
    """A subcommand stops with a message for the person and an exit code (main.py prints
    `toolsd COMMAND: message` on stderr)."""

    def __init__(self, command: str, message: str, code: int = 1):
        super().__init__(message)
        self.command = command
        self.message = message
        self.code = code


def socket_of(args) -> str:
    return resolve_socket_path(getattr(args, "socket", None))


def connect(args, socket: str | None = None, *, timeout: float | None = None) -> Client:
    """A Client of the daemon on `socket`, else on the socket `args` name (--socket, then the
    default path)."""
    return Client(socket or socket_of(args), timeout=timeout)


def answers(socket_path: str) -> bool:
    """Whether a toolsd daemon answers `hello` on `socket_path`."""
    from agent.own_daemon import answers as daemon_answers

    return daemon_answers(socket_path)


@contextlib.contextmanager
def daemon_socket(args, command: str) -> Iterator[str]:
    """The socket to use for the block, by the rule `toolsd agent` and `toolsd mcp` follow
    (agent/own_daemon.py): the daemon answering on --socket (or the default path), else one
    started for this run only, said on stderr, stopped when the block ends."""
    from agent.own_daemon import DaemonFailed, toolsd_socket

    def say(message: str) -> None:
        print(f"toolsd {command}: {message}", file=sys.stderr, flush=True)

    try:
        with toolsd_socket(getattr(args, "socket", None), say=say) as path:
            yield path
    except DaemonFailed as e:
        raise CommandFailed(command, f"could not start a toolsd daemon: {e}") from None


def require_daemon(args, command: str, why: str) -> str:
    """The socket of the daemon answering where `args` say; CommandFailed if none does
    (`why`: what needs one that lasts, e.g. "a session kept between commands")."""
    path = socket_of(args)
    if not answers(path):
        raise CommandFailed(command, f"no toolsd answers on {path}; {why} needs a daemon that "
                                     f"lasts: start one with `toolsd serve` (or ./scripts/run)")
    return path
