"""The wire contract's 1.2 "ports" messages (../shared/PROTOCOL.md, "Ports"): forwarding a
port of a session's own loopback to a listener on the daemon's machine. session.list's
`forwards` entries are ForwardInfo."""

from __future__ import annotations

from typing import Annotated

from msgspec import UNSET, Meta, Struct, UnsetType

Port = Annotated[int, Meta(ge=1, le=65535)]


class PortForwardParams(Struct):
    session: str
    port: Port  # inside the session, on 127.0.0.1 (then ::1, when refused there)
    bind: str = "127.0.0.1"  # an address of the daemon's machine; not loopback: --forward-bind
    host_port: Annotated[int, Meta(ge=0, le=65535)] = 0  # 0: any free port


class PortForwardResult(Struct):
    host: str
    port: int
    host_exec: list[str] | UnsetType = UNSET  # as protocol.HostExec


class PortCloseParams(Struct):
    session: str
    port: Port


class PortCloseResult(Struct):
    host_exec: list[str] | UnsetType = UNSET  # as protocol.HostExec


class ForwardInfo(Struct):
    port: int
    host: str
    host_port: int
