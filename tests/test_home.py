"""home.py: which folders are shown entry by entry and what is left out of them (on real
folders), and that a sandbox built from that shows no secret, even one made afterwards."""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import subprocess

import pytest

from conftest import short_tempdir
from toolsd.sandbox.bwrap import home, home_folders
from toolsd.sandbox.bwrap.home import CannotHide, check_hideable, plan
from toolsd.sandbox.bwrap.home_folders import ancestors, show_folder
from toolsd.sandbox.bwrap.policy import Policy, bwrap_argv, sandbox_env


def touch(path, text="x\n"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


@pytest.fixture
def fake_home(tmp_path):
    h = tmp_path / "home"
    touch(h / ".bashrc")
    touch(h / ".npmrc", "NPM-TOKEN\n")
    touch(h / ".ssh" / "id_rsa", "KEY\n")
    touch(h / ".config" / "gh" / "hosts.yml", "GH-TOKEN\n")
    touch(h / ".config" / "git" / "credentials", "GIT-CRED\n")
    touch(h / ".config" / "git" / "config", "[user]\n")
    touch(h / ".config" / "pip" / "pip.conf")
    touch(h / ".pyenv" / "lib" / "mod.py")
    touch(h / ".local" / "bin" / "tool")
    touch(h / ".local" / "share" / "keyrings" / "login.keyring", "RING\n")
    touch(h / ".local" / "share" / "app" / "data")
    touch(h / "proj" / "main.py")
    return str(h)


def test_ancestors_are_the_folders_on_the_way():
    assert ancestors([".config/git/credentials", ".ssh", ".local/share/keyrings"]) == {
        ".config", ".config/git", ".local", ".local/share"}


def test_a_folder_with_a_secret_below_is_listed_down_to_it(fake_home):
    touch(os.path.join(fake_home, "big.log"), "x" * (home_folders.COPY_FILE_MAX + 1))
    folder, outside = show_folder(fake_home, home.SECRETS, writable=True, bound=[".bashrc"])
    rel = lambda paths: sorted(os.path.relpath(p, fake_home) for p in paths)  # noqa: E731
    assert rel(folder.dirs) == [".config", ".config/git", ".local", ".local/share"]
    # Small files are the session's copies; what is bigger, or let back in with --show
    # (`bound`), is bound, as folders are.
    assert rel(folder.binds) == [".bashrc", ".config/pip", ".local/bin", ".local/share/app",
                                 ".pyenv", "big.log", "proj"]
    assert rel(folder.copies) == [".config/git/config"]
    assert folder.writable and outside == []
    # A read-only folder (another home) copies nothing: it is a tmpfs made read-only.
    other, _ = show_folder(fake_home, home.SECRETS)
    assert other.copies == () and f"{fake_home}/.config/git/config" in other.binds


def test_copies_keep_modes_and_times_and_their_state_says_when_they_change(
        fake_home, tmp_path):
    config = os.path.join(fake_home, ".config", "git", "config")
    os.chmod(config, 0o640)
    folder, _ = show_folder(fake_home, home.SECRETS, writable=True)
    dest = tmp_path / "copy"
    dest.mkdir()
    home_folders.copy_into(folder, str(dest))
    copied = dest / ".config" / "git" / "config"
    assert copied.read_text() == "[user]\n"
    assert os.stat(copied).st_mode & 0o777 == 0o640
    assert os.stat(copied).st_mtime_ns == os.stat(config).st_mtime_ns
    before = home_folders.copies_state(folder.copies)
    assert home_folders.copies_state(folder.copies) == before
    touch(config, "[user]\n\tname = changed\n")
    assert home_folders.copies_state(folder.copies) != before


def test_symlinks_are_made_and_hidden_ones_hide_their_targets(fake_home, tmp_path):
    dotfiles = os.path.join(fake_home, "dotfiles")
    touch(os.path.join(dotfiles, "aws", "credentials"), "AWS\n")
    touch(os.path.join(dotfiles, "kube", "config"), "KUBE\n")
    touch(os.path.join(dotfiles, "vimrc"))
    os.symlink("dotfiles/aws", os.path.join(fake_home, ".aws"))
    os.symlink("dotfiles/vimrc", os.path.join(fake_home, ".vimrc"))
    elsewhere = tmp_path / "elsewhere" / "docker"
    touch(elsewhere / "config.json", "DOCKER\n")
    os.symlink(str(elsewhere), os.path.join(fake_home, ".docker"))
    # A folder on the way to secrets, itself a symlink: hidden below where it leads.
    os.symlink("dotfiles", os.path.join(fake_home, ".kubelink"))
    folder, outside = show_folder(fake_home, (*home.SECRETS, ".kubelink/kube"))
    binds = {os.path.relpath(p, fake_home) for p in folder.binds}
    assert "dotfiles" not in binds and "dotfiles/vimrc" in binds
    assert "dotfiles/aws" not in binds and "dotfiles/kube" not in binds
    assert ("dotfiles/vimrc", os.path.join(fake_home, ".vimrc")) in folder.symlinks
    assert ("dotfiles", os.path.join(fake_home, ".kubelink")) in folder.symlinks
    assert not any(link.endswith((".aws", ".docker")) for _t, link in folder.symlinks)
    assert outside == [str(elsewhere)]


def test_sockets_are_left_out_and_keep_binds_under_a_hidden_entry(fake_home):
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(os.path.join(fake_home, "agent.sock"))
    try:
        touch(os.path.join(fake_home, ".cache", "venv", "bin", "python"))
        folder, _ = show_folder(fake_home, (*home.SECRETS, *home.OWN),
                                keep=[".cache/venv"])
        binds = {os.path.relpath(p, fake_home) for p in folder.binds}
        assert "agent.sock" not in binds and ".cache" not in binds
        assert ".cache/venv" in binds  # toolsd's own interpreter lives there
    finally:
        sock.close()


@pytest.fixture
def no_other_homes(monkeypatch):
    monkeypatch.setattr(home, "other_homes", lambda own: [])


def test_plan_a_home_in_the_workspace_covers_the_secrets_that_exist(fake_home, no_other_homes):
    view = plan(home=fake_home, workspace=fake_home, hidden=[])
    assert not view.home_is_own and view.folders == ()
    assert f"{fake_home}/.ssh" in view.hidden_dirs and f"{fake_home}/.npmrc" in view.hidden_files
    assert f"{fake_home}/.aws" not in view.hidden_dirs  # there is nothing to cover


@pytest.fixture
def var_tmp():
    """A folder outside /tmp (hidden paths under the host's /tmp are out of a session's
    sight anyway, and left alone)."""
    path = short_tempdir()
    yield pathlib.Path(path)
    shutil.rmtree(path, ignore_errors=True)


def test_plan_hidden_paths_that_do_not_exist(fake_home, var_tmp, no_other_homes):
    shelf = var_tmp / "shelf"
    touch(shelf / "public.txt")
    ws = str(var_tmp / "ws")
    os.makedirs(ws)
    view = plan(home=fake_home, workspace=ws, hidden=[
        str(shelf / "later" / "key"), f"{fake_home}/.myapp/token", "/tmp/toolsd-x/sock"])
    by_path = {f.path: f for f in view.folders}
    assert set(by_path) == {fake_home, str(shelf)}
    assert by_path[str(shelf)].binds == (str(shelf / "public.txt"),)
    assert not by_path[str(shelf)].writable
    assert f"{fake_home}/.myapp" not in by_path[fake_home].binds
    with pytest.raises(CannotHide, match="would appear in the workspace"):
        plan(home=fake_home, workspace=ws, hidden=[f"{ws}/secret"])


def test_show_lets_an_entry_back_into_the_own_home_only(fake_home, tmp_path, monkeypatch):
    other = tmp_path / "other"
    touch(other / ".npmrc", "OTHER\n")
    monkeypatch.setattr(home, "other_homes", lambda own: [str(other)])
    os.makedirs(tmp_path / "ws")
    view = plan(home=fake_home, workspace=str(tmp_path / "ws"), hidden=[], shown=[".npmrc"])
    binds = {b for f in view.folders for b in f.binds}
    assert f"{fake_home}/.npmrc" in binds and f"{other}/.npmrc" not in binds
    assert home.shown_entry(f"{fake_home}/.npmrc", fake_home) == ".npmrc"
    with pytest.raises(ValueError, match="not one of the entries"):
        home.shown_entry(f"{fake_home}/.bashrc", fake_home)


@pytest.mark.parametrize("path,says", [
    ("/", "cannot be hidden"), ("/proc/1/environ", "lies in /proc"), ("/dev/x", "lies in /dev"),
    ("/toolsd-no-such-folder/x", "nearest existing folder is /"),
])
def test_check_hideable(path, says):
    with pytest.raises(CannotHide, match=says):
        check_hideable(path)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
def test_a_sandbox_made_from_the_plan_shows_no_secret_even_one_made_later(
        fake_home, tmp_path, monkeypatch):
    other = tmp_path / "root"
    touch(other / ".profile", "OTHER-PROFILE\n")
    touch(other / ".pypirc", "OTHER-PYPI\n")
    monkeypatch.setattr(home, "other_homes", lambda own: [str(other)])
    ws = os.path.join(fake_home, "proj")
    view = plan(home=fake_home, workspace=ws, hidden=[])
    scratch = tmp_path / "scratch"
    own = tmp_path / "own-home"
    scratch.mkdir()
    own.mkdir()
    for folder in view.folders:
        if folder.writable:
            home_folders.copy_into(folder, str(own))
    policy = Policy(workspace=ws, scratch=str(scratch), folders=view.folders, home=str(own),
                    hidden_dirs=view.hidden_dirs, hidden_files=view.hidden_files,
                    env=sandbox_env(home=fake_home, path="/usr/bin:/bin", lang="C.UTF-8",
                                    extra={}))
    # Made on the host after the plan was: the sandbox must not show them.
    touch(os.path.join(fake_home, ".config", "gcloud", "creds"), "LATER-GCLOUD\n")
    touch(os.path.join(fake_home, ".aws", "credentials"), "LATER-AWS\n")
    touch(os.path.join(fake_home, ".config", "newtool", "token"), "LATER-NEW\n")
    touch(os.path.join(other, ".netrc"), "LATER-NETRC\n")
    script = ("grep -rh . ~ " + str(other) + " 2>/dev/null; echo made > ~/.cache/x; "
              "echo more >> ~/.bashrc && echo bashrc-copy; "
              "echo x > ~/.pyenv/lib/new 2>/dev/null || echo pyenv-ro; "
              f"echo x > {other}/new 2>/dev/null || echo other-ro; echo mine > main2.py")
    proc = subprocess.run(bwrap_argv(policy, bwrap=shutil.which("bwrap"))
                          + ["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for secret in ("NPM-TOKEN", "KEY", "GH-TOKEN", "GIT-CRED", "RING", "LATER-", "OTHER-PYPI"):
        assert secret not in proc.stdout, secret
    assert "OTHER-PROFILE" in proc.stdout and "[user]" in proc.stdout
    assert "bashrc-copy" in proc.stdout and "pyenv-ro" in proc.stdout and "other-ro" in proc.stdout
    assert open(os.path.join(fake_home, ".bashrc")).read() == "x\n"  # the host's: untouched
    assert (own / ".cache" / "x").read_text() == "made\n"  # the session's home: its scratch
    assert not os.path.exists(os.path.join(fake_home, ".cache"))
    assert open(os.path.join(ws, "main2.py")).read() == "mine\n"  # the workspace: writable
