"""image.read's short way to a file: the session's file helper
(sandbox/launch/file_helper_client.py), once it runs, reads it in the sandbox for one request on its socket, instead of a reader process
(sh, then head) spawned for each call, which was most of a small image's fixed cost.

The helper sees exactly what the session's commands see. Only a whole regular file of at
most one helper read (MAX_READ) is taken this way; for anything else (no helper yet, an
error of any kind, a FIFO, a device, a larger file) the caller reads through its reader
process as before, whose answers and errors image.read has always given."""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolsd.runtime import threads
from toolsd.sandbox.errors import SandboxError
from toolsd.tools import files
from toolsd.wire.files import MAX_READ
from toolsd.wire.protocol import ToolsdError

if TYPE_CHECKING:
    from toolsd.tools.session_view import SessionView

__all__ = ["read"]


async def read(session: SessionView, path: str, checked: bool) -> bytes | None:
    """The whole file at `path` through the helper, or None: read it the other way. The
    first call of a session starts the helper in the background and returns None.
    `checked`: the caller asked session.check_open and has not waited since; else (or
    after a wait for a read slot here) it is asked again before the helper reads."""
    helper = session.files
    if not helper.running:
        try:
            helper.start_in_background(session.sandbox.launcher, session.start_soon)
        except (ToolsdError, SandboxError):
            pass  # the session is closing: the reader process says so
        return None
    try:
        async with threads.held(helper.read_slots) as waited:
            result, data = await files.call(session, {"op": "read", "path": path, "offset": 0,
                                                      "length": MAX_READ},
                                            checked=checked and not waited)
    except (ToolsdError, SandboxError):
        return None
    if not result.get("eof") or len(data) != result.get("size"):
        return None  # larger than one read, or changed while read
    return bytes(data)
