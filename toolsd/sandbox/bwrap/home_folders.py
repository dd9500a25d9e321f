"""A folder shown entry by entry (see home.py): what it lists, the symlinks that lead to
hidden paths, and the copies of small files that the session's own home gets.

I/O: listing folders (scandir, lstat, realpath) and copying files, when a session starts.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable

from toolsd.sandbox.bwrap.policy import Folder

log = logging.getLogger("toolsd.home")

# The session's home gets copies of the host's files up to COPY_FILE_MAX, all of them
# together up to COPY_TOTAL_BYTES, rather than binds (see sandbox.Folder: every bind makes
# bwrap read the whole mount table again). A copy is the session's, writable; the host's
# file is never touched. Folders are bound: finding the small ones would take a walk of each
# at every session.open.
COPY_FILE_MAX = 64 * 1024
COPY_TOTAL_BYTES = 4 * 1024 * 1024


def ancestors(rels: Iterable[str]) -> set[str]:
    """Every proper ancestor folder of the relative paths: the folders that must be listed
    entry by entry so that those paths can be left out. Pure."""
    out = set()
    for rel in rels:
        parts = rel.split("/")
        for i in range(1, len(parts)):
            out.add("/".join(parts[:i]))
    return out


def inside(path: str, folder: str) -> bool:
    return path == folder or folder == "/" or path.startswith(folder.rstrip("/") + "/")


def relative(path: str, folder: str) -> str:
    return os.path.relpath(path, folder)


def show_folder(path: str, hidden: Iterable[str], *, keep: Iterable[str] = (),
                writable: bool = False, bound: Iterable[str] = (),
                cover_in: str = "", own_dirs: Iterable[str] = (),
                overlay: bool = False) -> tuple[Folder, list[str]]:
    """`path` as a Folder: its entries as they are now, less the `hidden` relative paths
    (existing or not); `keep` (relative) are bound even where something hidden covers them.
    In a `writable` one (the session's home) small files are copied, except `bound` ones,
    and `own_dirs` (relative folders, and those on the way) that exist are made the session's
    own: listed entry by entry rather than bound, so that new files can be made in them.
    With `overlay` (a writable one only), the folders it binds that are on the same
    filesystem as `path` are shown through an overlay (Folder.overlays), except `bound`.
    Also returns paths outside `path` that hidden symlinks in it lead to: the caller hides
    those where they are (existing ones), and the hidden paths that lie in `cover_in`, a
    folder mounted over this one (the workspace), which would show them again.

    A hidden entry that is a symlink leading elsewhere in the folder hides its target too
    (~/.ssh -> dotfiles/ssh would otherwise show the keys at ~/dotfiles/ssh); so does a
    listed folder that is one (~/.config -> dotfiles/config: dotfiles/config/gh is hidden).
    Other symlinks are made as they are: inside the sandbox they lead where the sandbox's
    view leads, which never holds what is hidden."""
    omit = {os.path.normpath(h) for h in hidden}
    read_only = {os.path.normpath(b) for b in bound}
    outside: set[str] = set()
    while True:
        listing = _Listing(path, omit, read_only, writable, own_dirs, overlay)
        # Rarely more than once: only symlinks at hidden paths, or on the way to them.
        grown = _follow_symlinks(path, omit, listing.linked, outside)
        if not grown:
            break
        omit |= grown
    if cover_in:
        outside |= {p for p in (os.path.join(path, o) for o in omit)
                    if inside(p, cover_in) and os.path.lexists(p)}
    binds = list(listing.binds)
    for rel in sorted({os.path.normpath(k) for k in keep}):
        if any(inside(rel, o) for o in omit):
            binds.append(os.path.join(path, rel))
    return (Folder(path=path, writable=writable, dirs=tuple(listing.dirs), binds=tuple(binds),
                   symlinks=tuple(listing.symlinks), copies=tuple(listing.copies),
                   overlays=tuple(listing.overlays)),
            sorted(outside))


class _Listing:
    """The entries of a folder shown entry by entry (see show_folder), and `linked`: the
    hidden paths, or folders on the way to them, that are symlinks."""

    def __init__(self, path: str, omit: set[str], read_only: set[str], writable: bool,
                 own_dirs: Iterable[str] = (), overlay: bool = False):
        self.path = path
        # Overlays on the filesystem the probe tried (sandbox/bwrap/overlay.py) only.
        self.overlay_dev = os.stat(path).st_dev if overlay and writable else None
        self.overlays: list[str] = []
        self.omit = omit
        own = {os.path.normpath(d) for d in own_dirs} if writable else set()
        self.expand = ancestors(omit) | ancestors(own) | own
        self.read_only = read_only
        self.writable = writable
        self.budget = COPY_TOTAL_BYTES
        self.dirs: list[str] = []
        self.binds: list[str] = []
        self.copies: list[str] = []
        self.symlinks: list[tuple[str, str]] = []
        self.linked: list[str] = []
        self._visit("")

    def _copied(self, entry: os.DirEntry, rel: str) -> bool:
        """Whether the file `entry` is copied rather than bound (and its size charged)."""
        if not self.writable or rel in self.read_only:
            return False
        size = entry.stat(follow_symlinks=False).st_size
        if size > COPY_FILE_MAX or size > self.budget:
            return False
        self.budget -= size
        return True

    def _visit(self, rel_dir: str) -> None:
        folder = os.path.join(self.path, rel_dir) if rel_dir else self.path
        try:
            it = os.scandir(folder)
        except OSError as e:
            # Not listable, yet it must be (something hidden is below it): shown empty. The
            # session could not list it either, but might have opened names in it.
            log.warning("%s cannot be listed (%s): sessions see it empty", folder, e)
            return
        with it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            rel = os.path.join(rel_dir, entry.name) if rel_dir else entry.name
            try:
                if entry.is_symlink():
                    if rel in self.omit or rel in self.expand:
                        self.linked.append(rel)
                    if rel not in self.omit:
                        self.symlinks.append((os.readlink(entry.path), entry.path))
                elif rel in self.omit:
                    continue
                elif entry.is_dir(follow_symlinks=False):
                    if rel in self.expand:
                        self.dirs.append(entry.path)
                        self._visit(rel)
                    else:
                        self.binds.append(entry.path)
                        if self.overlay_dev is not None and rel not in self.read_only and \
                                entry.stat(follow_symlinks=False).st_dev == self.overlay_dev:
                            self.overlays.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    (self.copies if self._copied(entry, rel) else self.binds).append(entry.path)
                # Sockets, fifos and devices are left out: a socket is a way into a service
                # (an agent, a daemon), not a file to read.
            except OSError:
                continue  # gone while listed


def copy_into(folder: Folder, home_dir: str) -> None:
    """Copy the files that `folder` (the session's home) holds copies of into `home_dir`,
    the host folder bound at its path, with their modes and times. A file gone since it was
    listed is left out, as a bind of it would be; one that grew is copied up to
    COPY_FILE_MAX."""
    for src in folder.copies:
        dest = os.path.join(home_dir, os.path.relpath(src, folder.path))
        try:
            fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                continue  # replaced since it was listed
            chunks, size = [], 0
            while size < COPY_FILE_MAX and (chunk := os.read(fd, COPY_FILE_MAX - size)):
                chunks.append(chunk)
                size += len(chunk)
        finally:
            os.close(fd)
        os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)
        with open(dest, "xb") as out:
            out.write(b"".join(chunks))
        os.chmod(dest, st.st_mode & 0o7777)
        os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns))


def copies_state(paths) -> tuple:
    """What copies of `paths` would hold, as far as a stat says: for a sandbox made ahead,
    to be compared with the host's files as they are now."""
    out = []
    for path in paths:
        try:
            st = os.lstat(path)
            out.append((path, st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode))
        except OSError:
            out.append((path,))
    return tuple(out)


def _follow_symlinks(path: str, omit: set[str], linked: list[str],
                     outside: set[str]) -> set[str]:
    """Relative paths to hide as well, because `linked` (hidden paths, or folders on the way
    to them, that are symlinks) lead to them; targets outside `path` go to `outside`
    (existing ones)."""
    grown: set[str] = set()
    for rel in linked:
        target = os.path.realpath(os.path.join(path, rel))
        below = [o for o in omit if o == rel or o.startswith(rel + "/")]
        for o in below:
            dest = os.path.normpath(os.path.join(target, o[len(rel):].lstrip("/")))
            if inside(dest, path) and dest != path:
                new = relative(dest, path)
                if new not in omit:
                    grown.add(new)
            elif not inside(dest, path) and os.path.lexists(dest):
                outside.add(dest)
    return grown
