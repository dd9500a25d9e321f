"""hostexec.Tracker on a real folder: repositories made, filled, moved, removed, bare ones,
submodules, and a flood of changes, each seen with no walk of the whole workspace."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from toolsd.sandbox.git_watch.hostexec import Tracker

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def git(*args: str) -> None:
    subprocess.run(["git", *args], check=True, capture_output=True)


@pytest.fixture
def ws(daemon_root):
    return daemon_root  # a fresh folder (not under /tmp), removed at the end


@pytest.fixture
def tracker(ws):
    git("init", "-q", os.path.join(ws, "old"))
    git("-C", os.path.join(ws, "old"), "config", "core.pager", "less")
    t = Tracker(ws)
    t.start()
    yield t
    t.close()


def test_nothing_changed_nothing_to_do(tracker):
    assert not tracker.changed() and tracker.update() == ()


def test_files_made_are_taken_in_without_a_thread_folders_need_one(ws, tracker):
    with open(os.path.join(ws, "notes.txt"), "w"):
        pass
    assert tracker.changed() and tracker.update_now() == ()
    assert not tracker.changed()
    os.mkdir(os.path.join(ws, "sub"))
    assert tracker.changed() and tracker.update_now() is None
    assert tracker.changed()  # read, not taken in yet: update() must still run
    git("init", "-q", os.path.join(ws, "sub"))
    git("-C", os.path.join(ws, "sub"), "config", "core.pager", "p")
    assert tracker.update() == (f"{ws}/sub/.git/config: core.pager = p",)


def test_a_repository_made_deep_down_and_changes_to_one_from_before(ws, tracker):
    deep = os.path.join(ws, "a", "b", "c", "d")
    git("init", "-q", deep)
    git("-C", deep, "config", "core.fsmonitor", "./x")
    git("-C", os.path.join(ws, "old"), "config", "core.pager", "evil")
    assert tracker.changed()
    assert tracker.update() == (f"{deep}/.git/config: core.fsmonitor = ./x",
                                f"{ws}/old/.git/config: core.pager = evil")


def test_an_empty_git_folder_filled_later(ws, tracker):
    os.makedirs(os.path.join(ws, "r", ".git"))
    assert tracker.update() == ()
    git("init", "-q", os.path.join(ws, "r"))
    git("-C", os.path.join(ws, "r"), "config", "diff.external", "d")
    assert tracker.update() == (f"{ws}/r/.git/config: diff.external = d",)


def test_moved_and_removed_repositories(ws, tracker):
    git("init", "-q", os.path.join(ws, "m", "r"))
    git("-C", os.path.join(ws, "m", "r"), "config", "core.editor", "e")
    tracker.update()
    os.rename(os.path.join(ws, "m"), os.path.join(ws, "n"))
    assert tracker.update() == (f"{ws}/n/r/.git/config: core.editor = e",)
    # A repository from before, moved: still compared with what it had (nothing new).
    os.rename(os.path.join(ws, "old"), os.path.join(ws, "older"))
    assert tracker.update() == (f"{ws}/n/r/.git/config: core.editor = e",)
    shutil.rmtree(os.path.join(ws, "n"))
    assert tracker.update() == ()


def test_bare_repositories_and_submodule_git_dirs(ws, tracker):
    git("init", "-q", "--bare", os.path.join(ws, "b.git"))
    git("-C", os.path.join(ws, "b.git"), "config", "core.hooksPath", "/x")
    modules = os.path.join(ws, "old", ".git", "modules", "sub")
    git("init", "-q", "--bare", modules)
    os.makedirs(os.path.join(ws, "sub"))
    with open(os.path.join(ws, "sub", ".git"), "w") as f:
        f.write("gitdir: ../old/.git/modules/sub\n")
    with open(os.path.join(modules, "hooks", "post-merge"), "w") as f:
        f.write("evil\n")
    assert tracker.update() == (f"{ws}/b.git/config: core.hookspath = /x",
                                f"{modules}/hooks/post-merge")


def test_a_flood_of_changes_overflows_the_queue_and_is_walked_again(ws, tracker):
    big = os.path.join(ws, "big")
    os.makedirs(big)
    tracker.update()  # big/ is watched: every folder made in it is an event
    max_events = int(open("/proc/sys/fs/inotify/max_queued_events").read())
    if max_events > 50_000:
        pytest.skip(f"max_queued_events is {max_events}: too many folders to make")
    for i in range(max_events + 10):
        os.mkdir(os.path.join(big, str(i)))
    git("init", "-q", os.path.join(big, "0", "r"))
    git("-C", os.path.join(big, "0", "r"), "config", "core.pager", "p")
    assert tracker.update() == (f"{big}/0/r/.git/config: core.pager = p",)


def test_what_is_there_when_rebaselined_is_not_reported(ws, tracker):
    git("init", "-q", os.path.join(ws, "r"))
    git("-C", os.path.join(ws, "r"), "config", "core.pager", "p")
    tracker.rebaseline()
    assert tracker.update() == ()


def test_what_the_session_makes_cannot_hang_the_look_nor_lead_it_out(ws, tracker, tmp_path):
    outside = tmp_path / "outside"
    (outside / "hooks").mkdir(parents=True)
    (outside / "hooks" / "secret-name").write_text("x")
    (outside / "config").write_text("[core]\n\tfsmonitor = host-only\n")
    r = os.path.join(ws, "r")
    git("init", "-q", r)
    gitdir = os.path.join(r, ".git")
    os.remove(os.path.join(gitdir, "config"))
    os.mkfifo(os.path.join(gitdir, "config"))  # an open of it would wait for a writer
    shutil.rmtree(os.path.join(gitdir, "hooks"))
    os.symlink(str(outside / "hooks"), os.path.join(gitdir, "hooks"))
    os.symlink(str(outside / "config"), os.path.join(gitdir, "config.worktree"))
    with open(os.path.join(gitdir, "commondir"), "w") as f:
        f.write(str(outside) + "\n")  # out of the workspace: not followed
    found = tracker.update()
    assert found == (f"{gitdir}/config.worktree -> {outside}/config",
                     f"{gitdir}/hooks -> {outside}/hooks")
    assert not any("secret-name" in line or "host-only" in line for line in found)


def test_past_the_watch_limit_the_report_says_it_is_incomplete(ws, monkeypatch):
    from toolsd.sandbox.git_watch import hostexec
    monkeypatch.setattr(hostexec, "MAX_WATCHES", 5)
    for i in range(10):
        os.makedirs(os.path.join(ws, f"d{i}"))
    t = Tracker(ws)
    t.start()
    try:
        assert len(t.found) == 1 and "not every folder" in t.found[0]
    finally:
        t.close()
