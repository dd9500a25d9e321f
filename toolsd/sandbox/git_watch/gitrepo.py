"""One git dir of a session's workspace, read as the host's git would read it: where its
hooks and config are, and what in them would run on the host (hostexec.py watches for them).

I/O: reads of files the session writes, none followed out of the workspace.
"""

from __future__ import annotations

import contextlib
import os
import stat

from toolsd.sandbox.git_watch import gitconfig
# Longest value shown in a report line.
_VALUE_CHARS = 200
# Most of a config file read (git reads more, but a session making one this big is worth a
# look anyway: its beginning is reported).
CONFIG_MAX = 4 * 1024 * 1024


def inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def is_gitdir(path: str) -> bool:
    """A git dir (a `.git` folder, or a bare repository): HEAD, objects/ and refs/, or a
    linked worktree's (HEAD and commondir)."""
    return os.path.isfile(os.path.join(path, "HEAD")) and (
        os.path.isfile(os.path.join(path, "commondir")) or (
            os.path.isdir(os.path.join(path, "objects"))
            and os.path.isdir(os.path.join(path, "refs"))))


def read_file(path: str, limit: int) -> bytes | None:
    """Up to `limit` bytes of the regular file at `path`, or None: not there, a symlink, a
    fifo (whose open would wait for a writer: the session makes these files), unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, size = [], 0
        while size < limit and (chunk := os.read(fd, limit - size)):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_gitfile(path: str) -> str | None:
    """The git dir that a `.git` file (a submodule's, a linked worktree's) points to,
    resolved; None if it is not one."""
    head = read_file(path, 4096)
    if head is None:
        return None
    first = head.split(b"\n", 1)[0].strip()
    if not first.startswith(b"gitdir:"):
        return None
    target = os.fsdecode(first[len(b"gitdir:"):].strip())
    return os.path.realpath(os.path.join(os.path.dirname(path), target))


def render(value: str | None) -> str:
    """A setting's value as one line of bounded length: control characters escaped."""
    if value is None:
        return "(true)"
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in value)
    return text if len(text) <= _VALUE_CHARS else text[:_VALUE_CHARS] + "..."


class Repo:
    """One git dir: where its hooks and config are, and what of them is new since the
    baseline (report lines). What it reads is the session's to make: a fifo, a symlink out
    of the workspace or a huge file must neither hang nor reveal what the session cannot
    read, so nothing is followed out of the workspace."""

    def __init__(self, gitdir: str, workspace: str):
        self.gitdir = gitdir
        self.workspace = workspace
        self.common = gitdir
        self.identity: tuple[int, int] | None = None
        self.lines: list[str] = []
        self.dirty = True
        self.locate()

    def locate(self) -> None:
        commondir = read_file(os.path.join(self.gitdir, "commondir"), 4096)
        self.common = self.gitdir
        if commondir is not None:
            common = os.path.realpath(os.path.join(self.gitdir, os.fsdecode(commondir.strip())))
            if inside(common, self.workspace):
                self.common = common
        try:
            st = os.stat(self.gitdir)
            self.identity = (st.st_dev, st.st_ino)
        except OSError:
            self.identity = None

    @property
    def hooks(self) -> str:
        return os.path.join(self.common, "hooks")

    def config_files(self) -> list[str]:
        return list(dict.fromkeys((os.path.join(self.common, "config"),
                                   os.path.join(self.gitdir, "config.worktree"))))

    def _followed(self, path: str, found: dict) -> str | None:
        """`path`, or where it leads if it is a symlink (which is reported): None when that
        is out of the workspace (not looked into: the session cannot write there, and must
        not learn through us what is there)."""
        if not os.path.islink(path):
            return path
        try:
            target = os.readlink(path)
        except OSError:
            return None
        found[("symlink", os.path.basename(path), target)] = f"{path} -> {render(target)}"
        real = os.path.realpath(path)
        return real if inside(real, self.workspace) else None

    def items(self) -> dict[tuple, str]:
        """{comparable item: report line} for everything in it that the host would run.
        Items compare across a move of the repository (no paths in them)."""
        found: dict[tuple, str] = {}
        hooks = self._followed(self.hooks, found)
        try:
            with os.scandir(hooks) if hooks else contextlib.nullcontext(()) as it:
                for e in it:
                    if e.name.endswith(".sample"):
                        continue  # git never runs these
                    st = e.stat(follow_symlinks=False)
                    ident = (e.name, st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)
                    found[("hook", *ident)] = os.path.join(self.hooks, e.name)
        except OSError:
            pass
        for path in self.config_files():
            name = os.path.basename(path)
            real = self._followed(path, found)
            data = read_file(real, CONFIG_MAX) if real else None
            if data is None:
                continue
            try:
                entries = gitconfig.parse(data.decode("utf-8", "surrogateescape"))
            except gitconfig.ConfigError as e:
                # git refuses the whole file then ("fatal: bad config line"): nothing of it
                # runs, but it changed, and a person should look before fixing it on the host.
                found[("bad", name, str(e))] = f"{path}: cannot be read as git config ({e})"
                continue
            for key, value in entries:
                if gitconfig.runs_code(key, value):
                    found[("config", name, key, value)] = f"{path}: {key} = {render(value)}"
        return found
