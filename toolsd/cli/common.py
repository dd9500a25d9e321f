"""What every subcommand that talks to the daemon needs: where it is (its socket, or a URL
with a token and a fingerprint), a connected Client, and the one rule for a daemon of its own.

`--url unix:///path` or `--url tls://host:port` (else $TOOLSD_URL, else `--socket`, else the
default socket); for TLS, the token from `--token-file FILE` or $TOOLSD_TOKEN (never on the
command line, where `ps` would show it), the daemon's certificate from `--fingerprint` or
$TOOLSD_FINGERPRINT, or a CA from `--ca-file`. Every Client of the CLI is made by `connect`
(one place to change how the CLI reaches a daemon).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator

from toolsd.client import Client, ToolsdError
from toolsd.client.remote import Target, target_from_options
from toolsd.wire.paths import resolve_socket_path


class CommandFailed(Exception):
    """A subcommand stops with a message for the person and an exit code (main.py prints
    `toolsd COMMAND: message` on stderr)."""

    def __init__(self, command: str, message: str, code: int = 1):
        super().__init__(message)
        self.command = command
        self.message = message
        self.code = code


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    """The options of the parent parser every subcommand shares (cli/main.py)."""
    parser.add_argument("--socket", default=argparse.SUPPRESS,
                        help="daemon socket (default: $TOOLSD_SOCKET, "
                             "$XDG_RUNTIME_DIR/toolsd/toolsd.sock, /tmp/toolsd-$UID/toolsd.sock)")
    parser.add_argument("--url", default=argparse.SUPPRESS,
                        help="the daemon as unix:///path/to.sock or tls://HOST:PORT "
                             "(default: $TOOLSD_URL, else the socket)")
    parser.add_argument("--token-file", default=argparse.SUPPRESS, metavar="FILE",
                        help="for tls://: a file holding the token (default: $TOOLSD_TOKEN)")
    parser.add_argument("--fingerprint", default=argparse.SUPPRESS,
                        help="for tls://: the daemon's certificate, sha256:HEX as `toolsd "
                             "token` prints it (default: $TOOLSD_FINGERPRINT)")
    parser.add_argument("--ca-file", default=argparse.SUPPRESS, metavar="FILE",
                        help="for tls://: trust the daemon's certificate through this CA "
                             "instead of a fingerprint (default: none)")


def socket_of(args) -> str:
    return resolve_socket_path(getattr(args, "socket", None))


def target_of(args) -> Target:
    """Where the daemon is: --url, else --socket, else $TOOLSD_URL, else the default."""
    try:
        return target_from_options(
            getattr(args, "url", None), getattr(args, "socket", None),
            getattr(args, "token_file", None), getattr(args, "fingerprint", None),
            getattr(args, "ca_file", None))
    except ValueError as e:
        raise ToolsdError("bad_params", str(e)) from None


def where(args) -> str:
    """The daemon as messages name it."""
    return target_of(args).where


def connect(args, socket: str | Target | None = None, *,
            timeout: float | None = None) -> Client:
    """A Client of the daemon at `socket` (a path or a Target), else where `args` say."""
    return Client(socket or target_of(args), timeout=timeout)


def answers(socket_path: str) -> bool:
    """Whether a toolsd daemon answers `hello` on `socket_path`."""
    from agent.calls.own_daemon import answers as daemon_answers

    return daemon_answers(socket_path)


@contextlib.contextmanager
def daemon_socket(args, command: str) -> Iterator[str | Target]:
    """The daemon to use for the block, by the rule `toolsd agent` and `toolsd mcp` follow
    (agent/calls/own_daemon.py): a remote one (tls://) as it is; the one answering on the socket;
    else one started for this run only, said on stderr, stopped when the block ends."""
    from agent.calls.own_daemon import DaemonFailed, toolsd_socket

    def say(message: str) -> None:
        print(f"toolsd {command}: {message}", file=sys.stderr, flush=True)

    try:
        with toolsd_socket(target_of(args), say=say) as path:
            yield path
    except DaemonFailed as e:
        raise CommandFailed(command, f"could not start a toolsd daemon: {e}") from None


def require_daemon(args, command: str, why: str) -> str | Target:
    """The daemon answering where `args` say; CommandFailed if none does (`why`: what needs
    one that lasts, e.g. "a session kept between commands")."""
    target = target_of(args)
    if target.tls:
        return target
    path = target.where
    if not answers(path):
        raise CommandFailed(command, f"no toolsd answers on {path}; {why} needs a daemon that "
                                     f"lasts: start one with `toolsd serve` (or ./scripts/run)")
    return path
