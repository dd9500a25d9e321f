"""Copying files and whole folders into and out of a session (protocol 1.2 "files"), as
`cp -r` would: `upload(client, local, session, remote)` and `download(client, session,
remote, local)` on an AsyncClient under trio; `Client.upload` / `Client.download` run them for
a blocking caller.

Many files move at once (`parallel` requests in flight on the one connection); a file larger
than a part moves in parts, into a temporary name renamed into place once whole, so a reader
never sees half a file. Symlinks are copied as links, with their target as it reads, and never
followed; special files (FIFOs, sockets, devices) are skipped and counted. Modes are kept
(permission bits, less setuid, setgid and sticky on the way out); times are not.

A target that is an existing folder receives the source inside it (`cp -r src dest/`); else
the target is the copy's own name.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import secrets
import stat
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from toolsd.wire.protocol import ToolsdError

if TYPE_CHECKING:
    from toolsd.client.asynchronous import AsyncClient

__all__ = ["CopyStats", "upload", "download", "PART_SIZE", "PARALLEL"]

# One part's bytes: a write's request and a read's reply must fit the frame limit (16 MiB by
# default; hello says the daemon's), and parts in flight are held in memory.
PART_SIZE = 4 << 20
PARALLEL = 32
TEMP_PREFIX = ".toolsd-part-"
# One shell.run making symlinks takes at most this much of `ln` lines.
_LINKS_SCRIPT_MAX = 32 * 1024


@dataclasses.dataclass
class CopyStats:
    """What a copy did so far (the progress callback gets it after each file) and at the end.
    `total_*` is what it found to copy."""

    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    bytes: int = 0
    skipped: int = 0  # special files: FIFOs, sockets, devices
    total_files: int = 0
    total_bytes: int = 0


Progress = Callable[[CopyStats], Any]


async def _pool(jobs: Iterator, worker: Callable, parallel: int) -> None:
    """Run `worker(job)` for every job, `parallel` at a time."""
    import trio

    async def run() -> None:
        for job in jobs:  # a shared iterator: trio runs one task at a time
            await worker(job)

    try:
        async with trio.open_nursery() as nursery:
            for _ in range(max(1, parallel)):
                nursery.start_soon(run)
    except BaseExceptionGroup as group:
        # The first failure is the copy's: the others are the workers it cancelled.
        raise _first(group) from None


def _first(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        import trio

        real = [e for e in error.exceptions if not isinstance(e, trio.Cancelled)]
        error = (real or error.exceptions)[0]
    return error


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


# ------------------------------------------------------------------ upload


async def upload(client: AsyncClient, local: str, session: str, remote: str, *,
                 parallel: int = PARALLEL, part_size: int = PART_SIZE,
                 progress: Progress | None = None) -> CopyStats:
    """Copy `local` (a file or a folder) to `remote` in `session` (as the session sees it; a
    relative path from its workspace)."""
    st = os.lstat(local)
    try:
        there = await client.file_stat(session, remote)
    except ToolsdError as e:
        if e.code != "not_found":
            raise
        there = None
    if there is not None and there["type"] == "dir":
        remote = posixpath.join(remote, os.path.basename(os.path.normpath(local)))
    stats = CopyStats()
    dirs, files, links = [], [], []
    if stat.S_ISDIR(st.st_mode):
        _walk_local(local, remote, dirs, files, links, stats)
    elif stat.S_ISLNK(st.st_mode):
        links.append((os.readlink(local), remote))
    elif stat.S_ISREG(st.st_mode):
        files.append((local, remote, st.st_size, stat.S_IMODE(st.st_mode)))
    else:
        stats.skipped += 1
    stats.total_files = len(files)
    stats.total_bytes = sum(f[2] for f in files)

    async def make_dir(path: str) -> None:
        await client.file_mkdir(session, path)
        stats.dirs += 1

    await _pool(iter(dirs), make_dir, parallel)
    parts: dict[str, list] = {}

    def jobs():
        for local_path, remote_path, size, mode in files:
            if size <= part_size:
                yield ("whole", local_path, remote_path, size, mode, 0)
                continue
            folder, name = posixpath.split(remote_path)
            temp = posixpath.join(folder, f"{TEMP_PREFIX}{secrets.token_hex(6)}-{name[:100]}")
            count = (size + part_size - 1) // part_size
            parts[temp] = [count, remote_path]
            for n in range(count):
                yield ("part", local_path, temp, size, mode, n * part_size)

    async def send(job) -> None:
        kind, local_path, target, size, mode, offset = job
        if kind == "whole":
            with open(local_path, "rb") as f:
                data = f.read()
            await client.file_write(session, target, data, mode=mode)
            _done(stats, len(data), progress)
            return
        fd = os.open(local_path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.pread(fd, min(part_size, size - offset), offset)
        finally:
            os.close(fd)
        await client.file_write(session, target, data, offset=offset, mode=mode)
        stats.bytes += len(data)
        left = parts[target]
        left[0] -= 1
        if left[0] == 0:
            await client.file_rename(session, target, left[1], overwrite=True)
            stats.files += 1
            if progress is not None:
                progress(stats)

    await _pool(jobs(), send, parallel)
    await _make_remote_links(client, session, links, stats)
    return stats


def _done(stats: CopyStats, size: int, progress: Progress | None) -> None:
    stats.files += 1
    stats.bytes += size
    if progress is not None:
        progress(stats)


def _walk_local(root: str, remote: str, dirs: list, files: list, links: list,
                stats: CopyStats) -> None:
    """The tree below `root`, parents first: never following a symlink."""
    dirs.append(remote)
    todo = [(root, remote)]
    while todo:
        folder, there = todo.pop()
        with os.scandir(folder) as it:
            items = sorted(it, key=lambda e: e.name)
        for item in items:
            path, target = item.path, posixpath.join(there, item.name)
            st = item.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                dirs.append(target)
                todo.append((path, target))
            elif stat.S_ISLNK(st.st_mode):
                links.append((os.readlink(path), target))
            elif stat.S_ISREG(st.st_mode):
                files.append((path, target, st.st_size, stat.S_IMODE(st.st_mode)))
            else:
                stats.skipped += 1


async def _make_remote_links(client: AsyncClient, session: str, links: list,
                             stats: CopyStats) -> None:
    """The symlinks, made by `ln` in the session (the file methods have no symlink call)."""
    script: list[str] = []
    size = 0

    async def run() -> None:
        result = await client.shell_run(session, "\n".join(["set -e", *script]))
        if result["exit_code"] != 0:
            raise ToolsdError("io_error", f"could not make symlinks in the session: "
                              f"{result['output'].strip()[-500:]}")

    for target, path in links:
        line = f"ln -sfn -- {_quote(target)} {_quote(path)}"
        if script and size + len(line) > _LINKS_SCRIPT_MAX:
            await run()
            script, size = [], 0
        script.append(line)
        size += len(line) + 1
        stats.symlinks += 1
    if script:
        await run()


# ------------------------------------------------------------------ download


async def download(client: AsyncClient, session: str, remote: str, local: str, *,
                   parallel: int = PARALLEL, part_size: int = PART_SIZE,
                   progress: Progress | None = None) -> CopyStats:
    """Copy `remote` in `session` (a file or a folder) to `local`."""
    top = await client.file_stat(session, remote)
    if os.path.isdir(local) and not os.path.islink(local):
        local = os.path.join(local, posixpath.basename(top["path"].rstrip("/")) or "root")
    stats = CopyStats()
    files: list[tuple[str, str, int, int]] = []
    links: list[tuple[str, str]] = []
    if top["type"] == "dir":
        await _walk_remote(client, session, top["path"], local, files, links, stats, parallel)
    elif top["type"] == "symlink":
        links.append((top["target"] or "", local))
    elif top["type"] == "file":
        files.append((top["path"], local, top["size"], top["mode"]))
    else:
        stats.skipped += 1
    stats.total_files = len(files)
    stats.total_bytes = sum(f[2] for f in files)
    parts: dict[str, list] = {}

    def jobs():
        for remote_path, local_path, size, mode in files:
            if size <= part_size:
                yield ("whole", remote_path, local_path, size, mode, 0, None)
                continue
            folder, name = os.path.split(local_path)
            temp = os.path.join(folder, f"{TEMP_PREFIX}{secrets.token_hex(6)}-{name[:100]}")
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
            count = (size + part_size - 1) // part_size
            parts[temp] = [count, local_path, fd, mode]
            for n in range(count):
                yield ("part", remote_path, temp, size, mode, n * part_size, fd)

    async def fetch(job) -> None:
        kind, remote_path, target, size, mode, offset, fd = job
        if kind == "whole":
            data = await _read_whole(client, session, remote_path, part_size)
            _write_local(target, data, mode & 0o777)
            _done(stats, len(data), progress)
            return
        reply = await client.file_read(session, remote_path, offset=offset,
                                       length=min(part_size, size - offset))
        os.pwrite(fd, reply["data"], offset)
        stats.bytes += len(reply["data"])
        left = parts[target]
        left[0] -= 1
        if left[0] == 0:
            os.fchmod(fd, mode & 0o777)
            os.close(fd)
            os.rename(target, left[1])
            stats.files += 1
            if progress is not None:
                progress(stats)

    try:
        await _pool(jobs(), fetch, parallel)
    finally:
        for count, _final, fd, _mode in parts.values():
            if count:  # not finished: its temporary file goes
                os.close(fd)
        for temp, (count, *_rest) in parts.items():
            if count:
                try:
                    os.unlink(temp)
                except OSError:
                    pass
    for target, path in links:
        if os.path.islink(path):
            os.unlink(path)
        os.symlink(target, path)
        stats.symlinks += 1
    return stats


async def _read_whole(client: AsyncClient, session: str, path: str, part_size: int) -> bytes:
    """A small file, in one read (and more if it grew meanwhile)."""
    chunks = []
    offset = 0
    while True:
        reply = await client.file_read(session, path, offset=offset, length=part_size)
        chunks.append(reply["data"])
        offset += len(reply["data"])
        if reply["eof"] or not reply["data"]:
            return b"".join(chunks)


def _write_local(path: str, data: bytes, mode: int) -> None:
    # O_NOFOLLOW: a symlink planted where a file goes is refused, never written through.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _local_dir(path: str) -> None:
    """Make folder `path`; an existing symlink there is refused (it could lead anywhere)."""
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        if os.path.islink(path) or not os.path.isdir(path):
            raise ToolsdError("io_error", f"{path} exists and is not a folder; move it away "
                              f"or copy elsewhere") from None


async def _walk_remote(client: AsyncClient, session: str, root: str, local: str, files: list,
                       links: list, stats: CopyStats, parallel: int) -> None:
    """List the remote tree folder by folder (many at once), making the local folders."""
    _local_dir(local)
    stats.dirs += 1
    level = [(root, local)]
    while level:
        found: list[tuple[str, str]] = []

        async def list_one(pair) -> None:
            there, here = pair
            reply = await client.file_list(session, there, depth=1, limit=1_000_000)
            if reply["truncated"]:
                raise ToolsdError("limit_exceeded", f"{there} holds more entries than one "
                                  f"listing returns; copy its subfolders one by one")
            for entry in reply["entries"]:
                name = entry["path"][len(there.rstrip("/")) + 1:]
                if (not entry["path"].startswith(there.rstrip("/") + "/") or "/" in name
                        or name in ("", ".", "..")):
                    raise ToolsdError("io_error", f"the session listed {entry['path']!r} "
                                      f"in {there}, which is not an entry of it")
                path = os.path.join(here, name)
                if entry["type"] == "dir":
                    found.append((entry["path"], path))
                elif entry["type"] == "file":
                    files.append((entry["path"], path, entry["size"], entry["mode"]))
                elif entry["type"] == "symlink":
                    links.append((entry["target"] or "", path))
                else:
                    stats.skipped += 1

        await _pool(iter(level), list_one, parallel)
        for _there, here in found:
            _local_dir(here)
            stats.dirs += 1
        level = found


def run_blocking(target: Any, copy: Callable, *args: Any, **options: Any) -> CopyStats:
    """`copy` (upload or download) for a blocking caller: under trio.run, on a connection
    of its own to `target` (a socket path, a URL or a remote.Target; a blocking Client has
    one request in flight at a time)."""
    import trio

    from toolsd.client.asynchronous import AsyncClient

    async def main() -> CopyStats:
        client = await AsyncClient.connect(target)
        try:
            return await copy(client, *args, **options)
        finally:
            await client.aclose()

    return trio.run(main)
