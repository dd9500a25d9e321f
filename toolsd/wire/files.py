"""The file methods of protocol 1.2 ("files", "watch"): params and results as msgspec Structs,
and the watch's event frame. docs/protocol.md, "Files", says what the contract leaves open."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from toolsd.wire.protocol import HostExec

# A path as a caller may give it: the kernel's PATH_MAX, in characters.
Path = Annotated[str, Meta(min_length=1, max_length=4096)]
Offset = Annotated[int, Meta(ge=0, le=1 << 62)]
Mode = Annotated[int, Meta(ge=0, le=0o7777)]
# The most one file.read returns (the contract's 8 MiB).
MAX_READ = 8 << 20
MAX_LIST = 1_000_000
EntryType = Literal["file", "dir", "symlink", "other"]


class FileReadParams(Struct):
    session: str
    path: Path
    offset: Offset = 0
    length: Annotated[int, Meta(ge=0)] | None = None


class FileReadResult(Struct, omit_defaults=True):
    data: bytes
    size: int
    eof: bool
    mode: int
    mtime: float
    host_exec: HostExec = UNSET


class FileWriteParams(Struct):
    session: str
    path: Path
    data: bytes
    offset: Offset | None = None
    append: bool = False
    mode: Mode | None = None
    parents: bool = True


class FileWriteResult(Struct, omit_defaults=True):
    size: int
    host_exec: HostExec = UNSET


class FileListParams(Struct):
    session: str
    path: Path
    depth: Annotated[int, Meta(ge=1, le=4096)] = 1
    limit: Annotated[int, Meta(ge=1, le=MAX_LIST)] = 10000


class FileEntry(Struct):
    path: str  # absolute, as the session sees it
    type: EntryType
    size: int
    mode: int  # permission bits (st_mode & 0o7777)
    mtime: float
    target: str | None  # a symlink's target, as it reads


class FileListResult(Struct, omit_defaults=True):
    entries: list[FileEntry]
    truncated: bool
    host_exec: HostExec = UNSET


class FileStatParams(Struct):
    session: str
    path: Path


class FileStatResult(FileEntry, omit_defaults=True):
    host_exec: HostExec = UNSET


class FileMkdirParams(Struct):
    session: str
    path: Path
    parents: bool = True


class FileRemoveParams(Struct):
    session: str
    path: Path
    recursive: bool = False


class FileRemoveResult(Struct, omit_defaults=True):
    removed: int
    host_exec: HostExec = UNSET


class FileRenameParams(Struct):
    session: str
    path: Path
    to: Path
    overwrite: bool = False


class FileDoneResult(Struct, omit_defaults=True):
    """The empty result of file.mkdir and file.rename."""

    host_exec: HostExec = UNSET


class FileWatchParams(Struct):
    session: str
    path: Path
    recursive: bool = True
    stream: bool = False


class FileWatchResult(Struct):
    events: int  # events sent
    dropped: int  # events lost: the queue was full, or the kernel's overflowed


FILE_EVENT = "file"
EventKind = Literal["created", "modified", "removed", "moved"]


class FileEvent(Struct, omit_defaults=True):
    """`{"id", "event": "file", "kind", "path", "to"}`: one change seen by a file.watch."""

    id: int
    event: str
    kind: EventKind
    path: str
    to: str | UnsetType = UNSET  # moves only


_encoder = msgspec.msgpack.Encoder()


def encode_file_event(request_id: int, kind: str, path: str, to: str | None) -> bytes:
    return _encoder.encode(FileEvent(id=request_id, event=FILE_EVENT, kind=kind, path=path,
                                     to=to if to is not None else UNSET))
