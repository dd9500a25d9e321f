"""file.read, file.write, file.list, file.stat, file.mkdir, file.remove, file.rename: done by
the session's file helper inside its sandbox (sandbox/launch/file_helper_client.py,
driver/file_helper.py), so that each sees and may touch exactly what the session's own
commands do."""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolsd.sandbox.errors import LauncherError
from toolsd.wire.files import (
    MAX_READ,
    FileDoneResult,
    FileEntry,
    FileListParams,
    FileListResult,
    FileMkdirParams,
    FileReadParams,
    FileReadResult,
    FileRemoveParams,
    FileRemoveResult,
    FileRenameParams,
    FileStatParams,
    FileStatResult,
    FileWriteParams,
    FileWriteResult,
)
from toolsd.wire.protocol import BAD_PARAMS, LIMIT_EXCEEDED, SESSION_CLOSED, ToolsdError

if TYPE_CHECKING:
    from toolsd.tools.session_view import SessionView

__all__ = ["read", "write", "listing", "stat", "mkdir", "remove", "rename", "call"]

# Room in a reply frame for all but a read's data.
_REPLY_ROOM = 64 * 1024


def check_path(path: str, what: str = "path") -> str:
    if "\0" in path:
        raise ToolsdError(BAD_PARAMS, f"{what} {path!r} contains a NUL byte, which no path can "
                          f"hold")
    return path


async def call(session: SessionView, meta: dict, data: bytes = b"", *, checked: bool = False,
               **options) -> tuple[dict, bytes]:
    """One request to the session's file helper (started on first use). `checked`: the
    caller asked session.check_open and has not waited since, so it is not asked again."""
    if not checked:
        session.check_open()
    try:
        return await session.files.call(session.sandbox.launcher, session.start_soon, meta, data,
                                        **options)
    except LauncherError as e:
        raise ToolsdError(SESSION_CLOSED, f"session {session.id}'s sandbox is gone ({e}); open "
                          f"a new session") from None


async def read(session: SessionView, p: FileReadParams) -> FileReadResult:
    most = min(MAX_READ, session.host.max_frame - _REPLY_ROOM)
    length = most if p.length is None else min(p.length, most)
    async with session.files.read_slots:
        result, data = await call(session, {"op": "read", "path": check_path(p.path),
                                            "offset": p.offset, "length": length})
    return FileReadResult(data=data, size=int(result["size"]), eof=bool(result["eof"]),
                          mode=int(result["mode"]), mtime=float(result["mtime"]))


async def write(session: SessionView, p: FileWriteParams) -> FileWriteResult:
    limit = session.limits.file_mb << 20
    end = (p.offset or 0) + len(p.data)
    if end > limit:
        raise ToolsdError(LIMIT_EXCEEDED, f"{p.path} would be {end} bytes, over the session's "
                          f"file size limit of {limit} bytes (limits.file_mb "
                          f"{session.limits.file_mb}); write less, or open the session with a "
                          f"larger limits.file_mb")
    if p.append and p.offset is not None:
        raise ToolsdError(BAD_PARAMS, "file.write: give offset or append, not both")
    meta = {"op": "write", "path": check_path(p.path), "offset": p.offset, "append": p.append,
            "mode": p.mode, "parents": p.parents}
    result, _ = await call(session, meta, p.data)
    return FileWriteResult(size=int(result["size"]))


def _entry(cls, raw: dict):
    return cls(path=str(raw["path"]), type=raw["type"] if raw["type"] in (
        "file", "dir", "symlink") else "other", size=int(raw["size"]), mode=int(raw["mode"]),
        mtime=float(raw["mtime"]), target=None if raw.get("target") is None
        else str(raw["target"]))


async def listing(session: SessionView, p: FileListParams) -> FileListResult:
    result, _ = await call(session, {"op": "list", "path": check_path(p.path),
                                     "depth": p.depth, "limit": p.limit})
    return FileListResult(entries=[_entry(FileEntry, e) for e in result["entries"]],
                          truncated=bool(result["truncated"]))


async def stat(session: SessionView, p: FileStatParams) -> FileStatResult:
    result, _ = await call(session, {"op": "stat", "path": check_path(p.path)})
    return _entry(FileStatResult, result)


async def mkdir(session: SessionView, p: FileMkdirParams) -> FileDoneResult:
    await call(session, {"op": "mkdir", "path": check_path(p.path), "parents": p.parents})
    return FileDoneResult()


async def remove(session: SessionView, p: FileRemoveParams) -> FileRemoveResult:
    result, _ = await call(session, {"op": "remove", "path": check_path(p.path),
                                     "recursive": p.recursive})
    return FileRemoveResult(removed=int(result["removed"]))


async def rename(session: SessionView, p: FileRenameParams) -> FileDoneResult:
    await call(session, {"op": "rename", "path": check_path(p.path),
                         "to": check_path(p.to, "to"), "overwrite": p.overwrite})
    return FileDoneResult()
