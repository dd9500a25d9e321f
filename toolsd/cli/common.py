"""What every subcommand that talks to the daemon needs: where it is (its socket, or a URL
with a token and a fingerprint), and a connected Client.

`--url unix:///path` or `--url tls://host:port` (else $TOOLSD_URL, else `--socket`, else the
default socket); for TLS, the token from `--token-file FILE` or $TOOLSD_TOKEN (never on the
command line, where `ps` would show it), the daemon's certificate from `--fingerprint` or
$TOOLSD_FINGERPRINT, or a CA from `--ca-file`.
"""

from __future__ import annotations

import argparse

from toolsd.client import Client, ToolsdError
from toolsd.client.remote import Target, target_from_options
from toolsd.wire.paths import resolve_socket_path


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
                             "instead of a fingerprint")


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


def connect(args, timeout: float | None = None) -> Client:
    return Client(target_of(args), timeout=timeout)
