"""The handlers of the file methods (protocol 1.2 "files", "watch") for dispatch.py's table:
each runs its tool (tools/files.py, tools/file_watch.py) on the session its params name,
which the table's row gives it (On.SESSION)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Awaitable, Callable, Protocol

from toolsd.tools import file_watch as file_watch_tool, files
from toolsd.wire.files import FileWatchParams, FileWatchResult

if TYPE_CHECKING:
    from toolsd.daemon.session import Session
    from toolsd.tools.answers import Answer

__all__ = ["file_read", "file_write", "file_list", "file_stat", "file_mkdir", "file_remove",
           "file_rename", "file_watch"]


class CallWithAnswer(Protocol):
    """The part of dispatch.Call these handlers read (a Protocol: dispatch.py imports this
    module, never the other way)."""

    @property
    def answer(self) -> Answer | None: ...


def _on_session(tool: Callable[[Session, object], Awaitable[object]]):
    """A dispatch handler (an On.SESSION row's) for a file tool, which needs nothing but
    the session and the params."""
    async def handler(session: Session, p, call: CallWithAnswer) -> object:
        return await tool(session, p)

    handler.__name__ = f"file_{tool.__name__}"
    return handler


file_read = _on_session(files.read)
file_write = _on_session(files.write)
file_list = _on_session(files.listing)
file_stat = _on_session(files.stat)
file_mkdir = _on_session(files.mkdir)
file_remove = _on_session(files.remove)
file_rename = _on_session(files.rename)


async def file_watch(session: Session, p: FileWatchParams,
                     call: CallWithAnswer) -> FileWatchResult:
    return await file_watch_tool.watch(session, p, call.answer)
