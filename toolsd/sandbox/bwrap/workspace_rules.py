"""Which folders can be a session's workspace: never a hidden path, nor one inside it.

A hidden path is an entry of the homes' list (home.SECRETS and home.OWN, in every home a
session could read), a `toolsd serve --hide` path, or one of the daemon's own folders (its
socket's and its state). The sandbox binds the workspace at its own path after it has hidden
those, so a workspace that is one of them, or lies in one, would show what is hidden
(`--workspace ~/.ssh` would serve the keys, writable). Such a workspace is refused at
session.open, with a message that names the rule. A workspace that merely contains a hidden
path is served: the path is covered inside it (home.plan). The host's /tmp itself is
refused too: other programs' sockets appear there at any time, and one made after the
session opened could not be hidden.

Every path is compared resolved (realpath), and so is each hidden entry: a workspace named
through a symlink or `..`, and a hidden entry that is itself a symlink (`~/.ssh ->
dotfiles/ssh`), meet the same rule. I/O: realpath and the homes' listing (home.other_homes).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping

from toolsd.sandbox.bwrap import home
DOCS = 'docs/sandbox.md, "Which folders can be a workspace"'


def hidden_entries(own_home: str, shown: Iterable[str] = ()) -> dict[str, str]:
    """{resolved path: the entry as a person writes it} of every hidden entry of every home:
    the session's own (`own_home`, less what `--show` lets in) and the other homes."""
    own_home = os.path.realpath(own_home)
    found: dict[str, str] = {}
    for h in [own_home, *home.other_homes(own_home)]:
        names = home.hidden_names(shown if h == own_home else ())
        label = "~" if h == own_home else h
        resolve = _Resolver(h)
        for name in names:
            path = os.path.join(h, name)
            for candidate in (os.path.normpath(path), resolve(name)):
                found.setdefault(candidate, f"{label}/{name}")
    return found


class _Resolver:
    """os.path.realpath of paths below one resolved folder, with one listing of the folder,
    an lstat per folder below it that they share, and realpath's own walk only where a
    symlink is met: realpath of each of the homes' hidden names alone made session.open
    take milliseconds. The same answers as realpath (a component that does not exist is
    taken literally, as realpath does)."""

    def __init__(self, folder: str):
        self.folder = folder
        self._prefix = folder.rstrip("/") + "/"
        # path -> "link", "missing" or "other"; the folder's own entries from one listing
        self._kinds: dict[str, str] = {}
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    self._kinds[entry.path] = "link" if entry.is_symlink() else "other"
            self._listed = True
        except OSError:
            self._listed = False

    def _kind(self, path: str, parent: str) -> str:
        kind = self._kinds.get(path)
        if kind is None:
            if parent == self.folder and self._listed:
                kind = "missing"  # not in the listing
            elif self._kinds.get(parent) == "missing":
                kind = "missing"  # nothing can be in what does not exist
            else:
                try:
                    kind = "link" if stat.S_ISLNK(os.lstat(path).st_mode) else "other"
                except OSError:
                    kind = "missing"
            self._kinds[path] = kind
        return kind

    def __call__(self, name: str) -> str:
        path = self._prefix + name
        if os.path.normpath(path) != path:
            return os.path.realpath(path)  # "..", "." or "//": realpath's own rules
        parent = self.folder
        for part in name.split("/"):
            here = parent.rstrip("/") + "/" + part
            if self._kind(here, parent) == "link":
                return os.path.realpath(path)
            parent = here
        return path


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def refusal(workspace: str, *, own_home: str, shown: Iterable[str] = (),
            own_folders: Mapping[str, str] = {}) -> str | None:
    """Why `workspace` (resolved) cannot be served, or None. `own_folders`: {path: what it
    is, in words} of the daemon's own folders and the --hide paths."""
    if workspace == "/tmp":
        return (f"workspace /tmp is the host's shared /tmp, where other programs keep their "
                f"sockets (ssh and gpg agents, tmux and screen, X11, other toolsd daemons); "
                f"one made after the session opened could not be hidden, and a session "
                f"could act outside its sandbox through it ({DOCS}). Open a folder inside "
                f"/tmp instead (mkdir /tmp/work); the session's own /tmp is private anyway")
    for path, what in own_folders.items():
        real = os.path.realpath(path)
        if _inside(workspace, real):
            where = "is" if workspace == real else "lies inside"
            return (f"workspace {workspace} {where} {real} ({what}), and sessions must "
                    f"never see toolsd's own folders or hidden paths ({DOCS}); open the "
                    f"session on a folder outside it")
    for path, entry in hidden_entries(own_home, shown).items():
        if _inside(workspace, path):
            where = "is" if workspace == path else "lies inside"
            return (f"workspace {workspace} {where} {entry}, which toolsd hides from every "
                    f"session (keys, tokens and credentials live there: {DOCS}); open the "
                    f"session on a project folder elsewhere")
    return None
