"""The mounts a Policy asks for, checked and ordered: what bwrap_argv turns into argv.

Pure, as policy.py: paths are compared as strings, never looked up. A Policy whose plan raises
ValueError cannot be made (Policy checks it when it is built).
"""

from __future__ import annotations

import os.path
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from toolsd.sandbox.bwrap.policy import Policy

# bwrap mounts its own /dev and /proc; a workspace bound over them would put the host's
# devices or processes back (and writable), so no workspace may live there.
_SYSTEM_MOUNTS = ("/dev", "/proc")


@dataclass(frozen=True)
class PlannedFolder:
    path: str
    writable: bool
    dirs: tuple[str, ...]  # the Folder's, then those the workspace needs in a read-only one
    binds: tuple[str, ...]
    symlinks: tuple[tuple[str, str], ...]
    overlays: frozenset[str] = frozenset()  # of binds: shown writable, writes in the sandbox


@dataclass(frozen=True)
class Plan:
    workspace: str
    scratch: str
    home: str
    extra_ro_binds: tuple[str, ...]
    outer_hidden_dirs: tuple[str, ...]  # contain the workspace: mounted before it
    folders: tuple[PlannedFolder, ...]  # outermost first
    pinned: tuple[str, ...]
    protected: tuple[str, ...]
    hidden_dirs: tuple[str, ...]  # the rest: mounted last
    hidden_files: tuple[str, ...]


def plan_mounts(policy: Policy) -> Plan:
    """Normalise, deduplicate and order every path of the policy; ValueError on conflicts."""
    ws = _abs_path("workspace", policy.workspace)
    if ws == "/":
        raise ValueError("the workspace cannot be / (it would make the whole host writable); "
                         "open the session on a project folder")
    for system in _SYSTEM_MOUNTS:
        if _inside(ws, system):
            raise ValueError(f"the workspace {ws} lies in {system}, which the sandbox replaces "
                             "with its own; open the session on a project folder")
    scratch = _abs_path("scratch", policy.scratch)
    if scratch == "/":
        raise ValueError("the scratch folder cannot be /; give each session its own folder")

    protected = _paths("protected", policy.protected)
    for path in protected:
        if not _inside(path, ws):
            raise ValueError(f"protected path {path} is not inside the workspace {ws}; "
                             "only workspace paths can be re-bound read-only")
    pinned = _paths("pinned", policy.pinned)
    for path in pinned:
        if not _inside(path, ws) or path == ws:
            raise ValueError(f"pinned path {path} is not inside the workspace {ws}")
    if not policy.writable:
        protected = []  # the whole workspace is read-only already
        pinned = []

    dirs = _paths("hidden_dirs", policy.hidden_dirs)
    files = _paths("hidden_files", policy.hidden_files)
    for path in (*dirs, *files):
        if path == "/":
            raise ValueError("/ cannot be hidden: it would hide the whole system")
        if path == ws:
            raise ValueError(f"the workspace {ws} is itself a hidden path; hiding it would "
                             "make the session useless and showing it would expose what is "
                             "hidden: open the session on a folder inside it or elsewhere")
    # An extra bind inside the workspace would add nothing the workspace does not show.
    extras = [e for e in _paths("extra_ro_binds", policy.extra_ro_binds) if not _inside(e, ws)]

    # Inside the sandbox /tmp is the session's scratch, so host paths under /tmp are out of
    # sight already; a tmpfs there would only plant empty mount points in the scratch. The
    # exceptions are what the workspace or an extra bind brings back from the host's /tmp.
    def in_sight(path: str) -> bool:
        return not _inside(path, "/tmp") or any(_inside(path, r) for r in (ws, *extras))

    dirs = [d for d in dirs if in_sight(d)]
    files = [f for f in files if in_sight(f)]

    def covered(path: str, *, equal_too: bool) -> bool:
        # A hidden path under another hidden dir is hidden by that tmpfs already, except a
        # path in the workspace under a dir that contains the workspace: the workspace is
        # bound again on top of that tmpfs, so the inner path needs its own mount.
        for d in dirs:
            if d == path and not equal_too:
                continue
            if _inside(path, d) and not (_inside(ws, d) and _inside(path, ws)):
                return True
        return False

    # A hidden dir that contains the workspace (ws = ~/.docker/proj, hidden ~/.docker):
    # mount the tmpfs first and the workspace on top. The user chose that folder, so it stays
    # usable, and everything else in the hidden dir stays hidden.
    outer = sorted((d for d in dirs if _inside(ws, d) and not covered(d, equal_too=False)),
                   key=lambda d: d.count("/"))
    inner = [d for d in dirs if not _inside(ws, d) and not covered(d, equal_too=False)]
    # A hidden dir INSIDE the workspace (ws = $HOME, hidden ~/.ssh) is simply mounted after
    # the workspace, like every other hiding mount: the workspace bind can never uncover it.
    files = [f for f in files if not covered(f, equal_too=True)]

    for e in extras:
        for d in dirs:
            if _inside(e, d):
                raise ValueError(f"extra read-only bind {e} lies inside hidden folder {d}; "
                                 "hidden paths stay hidden, so move it or stop hiding that folder")
    folders = _plan_folders(policy, ws, dirs)
    for e in extras:
        for f in folders:
            if _inside(e, f.path) and not any(_inside(e, b) for b in f.binds):
                raise ValueError(f"extra read-only bind {e} lies inside {f.path}, which shows "
                                 f"only the entries it lists; list it there instead")

    def seen(path: str) -> bool:
        # Inside a folder only its entries (and the workspace, mounted on top) can be seen:
        # a hiding mount elsewhere in it would hide nothing, and its mount point could not
        # even be made in a read-only one.
        return _inside(path, ws) or all(
            not _inside(path, f.path) or any(_inside(path, b) for b in f.binds)
            for f in folders)

    return Plan(workspace=ws, scratch=scratch, home=policy.home,
                 extra_ro_binds=tuple(extras),
                 outer_hidden_dirs=tuple(outer), folders=folders, pinned=tuple(pinned),
                 protected=tuple(protected),
                 hidden_dirs=tuple(d for d in inner if seen(d)),
                 hidden_files=tuple(f for f in files if seen(f)))


def _plan_folders(policy: Policy, ws: str, hidden_dirs: list[str]) -> tuple[PlannedFolder, ...]:
    """Validate and order the policy's folders; ValueError on a folder that cannot be shown.
    A folder that a hidden dir covers, or that lies in another folder but in none of its
    entries, is hidden already and dropped."""
    if not isinstance(policy.folders, tuple):
        raise ValueError("folders must be a tuple of Folder")
    writable = [f for f in policy.folders if f.writable]
    if len(writable) > 1:
        raise ValueError("only one folder (the session's home) can be writable")
    if writable and not policy.home:
        raise ValueError("a writable folder needs Policy.home, the host folder bound there")
    if policy.home:
        _abs_path("home", policy.home)
    checked = []
    for folder in policy.folders:
        path = _abs_path("folder", folder.path)
        if path == "/":
            raise ValueError("/ cannot be shown entry by entry; name a folder below it")
        for system in _SYSTEM_MOUNTS:
            if _inside(path, system):
                raise ValueError(f"folder {path} lies in {system}, which the sandbox replaces")
        if _inside(path, ws):
            raise ValueError(f"folder {path} is inside the workspace {ws}, which shows it "
                             f"as it is; the workspace cannot also show it entry by entry")
        entries = {
            "dirs": _paths("folder dirs", folder.dirs),
            "binds": _paths("folder binds", folder.binds),
            "symlinks": _paths("folder symlinks", (link for _t, link in folder.symlinks)),
            "copies": _paths("folder copies", folder.copies),
        }
        overlays = set(_paths("folder overlays", folder.overlays))
        if overlays and not folder.writable:
            raise ValueError(f"folder {path}: only the session's home (writable) can show "
                             f"folders through an overlay")
        if not overlays <= set(entries["binds"]):
            raise ValueError(f"folder {path}: overlays must be bound entries of it, not "
                             f"{sorted(overlays - set(entries['binds']))}")
        if entries["copies"] and not folder.writable:
            raise ValueError(f"folder {path}: only the session's home (writable) can hold "
                             f"copies; bind the files instead")
        for what, paths in entries.items():
            for entry in paths:
                if entry == path or not _inside(entry, path):
                    raise ValueError(f"folder {path}: {what} entry {entry} is not inside it")
        for target, _link in folder.symlinks:
            if not isinstance(target, str) or not target or "\0" in target:
                raise ValueError(f"folder {path}: symlink target {target!r} is not a path")
        checked.append((path, folder, {**entries, "overlays": overlays}))
    checked.sort(key=lambda c: c[0].count("/"))
    planned: list[PlannedFolder] = []
    for path, folder, entries in checked:
        if any(_inside(path, d) for d in hidden_dirs):
            continue
        outer = [f for f in planned if _inside(path, f.path) and f.path != path]
        if any(not f.writable and not any(_inside(path, b) for b in f.binds) for f in outer):
            continue
        if any(f.path == path for f in planned):
            raise ValueError(f"folder {path} is listed twice")
        made = list(entries["dirs"])
        if not folder.writable and _inside(ws, path) and not any(
                _inside(ws, b) for b in entries["binds"]):
            # The workspace is mounted after this folder is read-only: its mount point (and
            # the folders on the way) must be made while it can still be written.
            step = path
            for part in os.path.relpath(ws, path).split("/"):
                step = os.path.join(step, part)
                if step not in made:
                    made.append(step)
        planned.append(PlannedFolder(
            path=path, writable=folder.writable, dirs=tuple(sorted(made, key=_depth)),
            binds=tuple(entries["binds"]),
            symlinks=tuple((t, _abs_path("symlink", link)) for t, link in folder.symlinks),
            overlays=frozenset(entries["overlays"])))
    # The home folder and the scratch may lie in the workspace (one that holds the state
    # folder): bwrap takes a bind's source from the host's tree, and the state folder they
    # are in is hidden in the workspace.
    return tuple(planned)


def _depth(path: str) -> int:
    return path.count("/")


def _abs_path(what: str, path: object) -> str:
    if not isinstance(path, str) or not os.path.isabs(path):
        raise ValueError(f"{what} must be an absolute path, got {path!r}")
    if "\0" in path:
        raise ValueError(f"{what} {path!r} contains a NUL byte, which no path can hold")
    # normpath is string work only; it makes "/a/b/" and "/a//b" compare equal to "/a/b".
    # POSIX keeps a leading "//" as is; fold it, bwrap treats it as "/".
    norm = os.path.normpath(path)
    return "/" + norm.lstrip("/")


def _paths(what: str, paths: Iterable[str]) -> list[str]:
    """Normalised, duplicates dropped, first occurrence's order kept."""
    if isinstance(paths, (str, bytes)):
        raise ValueError(f"{what} must be a list of paths, not one string")
    seen: dict[str, None] = {}
    for path in paths:
        seen.setdefault(_abs_path(f"{what} entry", path), None)
    return list(seen)


def _inside(path: str, folder: str) -> bool:
    """`path` is `folder` or lies beneath it (normalised absolute paths, no I/O)."""
    return path == folder or folder == "/" or path.startswith(folder + "/")
