"""The wire contract's 1.1 "tty" and "stdin" messages: typing into a background process and
sizing its terminal (../shared/PROTOCOL.md, "Input and terminals"). The fields they add to
process.start and process.output are in protocol.py."""

from __future__ import annotations

from typing import Annotated

from msgspec import UNSET, Meta, Struct, UnsetType

# A terminal's columns or rows: the kernel keeps them in 16 bits, and past a few thousand a
# full-screen program would only allocate a screen that no terminal shows.
MAX_TERMINAL_SIDE = 10_000
TerminalSide = Annotated[int, Meta(ge=1, le=MAX_TERMINAL_SIDE)]


class ProcessWriteParams(Struct):
    id: str  # or the process's name (docs/protocol.md)
    session: str | None = None  # where a name is looked for
    data: str = ""  # UTF-8 on the way in; control keys as characters ("\u0003": Ctrl-C)
    eof: bool = False  # after `data`: close the pipe, or Ctrl-D on a terminal


class ProcessWriteResult(Struct):
    written: int  # bytes of `data` taken; fewer when the process does not read
    host_exec: list[str] | UnsetType = UNSET  # as protocol.HostExec


class ProcessResizeParams(Struct):
    id: str  # or the process's name (docs/protocol.md)
    cols: TerminalSide
    rows: TerminalSide
    session: str | None = None  # where a name is looked for


class ProcessResizeResult(Struct):
    host_exec: list[str] | UnsetType = UNSET  # as protocol.HostExec
