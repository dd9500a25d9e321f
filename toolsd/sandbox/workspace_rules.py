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
from collections.abc import Iterable, Mapping

from toolsd.sandbox import home

DOCS = 'docs/sandbox.md, "Which folders can be a workspace"'


def hidden_entries(own_home: str, shown: Iterable[str] = ()) -> dict[str, str]:
    """{resolved path: the entry as a person writes it} of every hidden entry of every home:
    the session's own (`own_home`, less what `--show` lets in) and the other homes."""
    own_home = os.path.realpath(own_home)
    found: dict[str, str] = {}
    for h in [own_home, *home.other_homes(own_home)]:
        names = home.hidden_names(shown if h == own_home else ())
        label = "~" if h == own_home else h
        for name in names:
            path = os.path.join(h, name)
            for candidate in (os.path.normpath(path), os.path.realpath(path)):
                found.setdefault(candidate, f"{label}/{name}")
    return found


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
