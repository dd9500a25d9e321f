"""What every subcommand that talks to the daemon needs: its socket, a connected Client."""

from __future__ import annotations

from toolsd.client import Client
from toolsd.wire.paths import resolve_socket_path


def socket_of(args) -> str:
    return resolve_socket_path(getattr(args, "socket", None))


def connect(args) -> Client:
    return Client(socket_of(args))
