"""inotify.Inotify, the one instance that every session's Tracker watches through: events
reach each tracker watching their folder, a tracker that leaves takes only its own share of
a watch, and events lost (the shared queue overflowed, or a tracker's inbox was full) make
the tracker that lost them walk its workspace again."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from toolsd.sandbox.git_watch import inotify
from toolsd.sandbox.git_watch.hostexec import Tracker

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def git(*args: str) -> None:
    subprocess.run(["git", *args], check=True, capture_output=True)


@pytest.fixture
def instance():
    return inotify.Inotify()  # its descriptor lives as long as the test process


@pytest.fixture
def two(daemon_root, instance):
    """Two trackers on one instance, on workspaces side by side."""
    ws = [os.path.join(daemon_root, name) for name in ("one", "two")]
    trackers = []
    for w in ws:
        os.makedirs(w)
        trackers.append(Tracker(w, instance))
        trackers[-1].start()
    yield ws, trackers
    for t in trackers:
        t.close()
    assert instance.watches() == 0


def test_a_tracker_that_leaves_releases_its_watches_and_not_the_others(daemon_root, instance):
    git("init", "-q", os.path.join(daemon_root, "r"))
    a, b = Tracker(daemon_root, instance), Tracker(daemon_root, instance)
    a.start()
    alone = instance.watches()
    b.start()
    assert instance.watches() == alone  # the same folders: the kernel's watches are shared
    hook = os.path.join(daemon_root, "r", ".git", "hooks", "pre-commit")
    with open(hook, "w") as f:
        f.write("evil\n")
    assert a.update() == b.update() == (hook,)
    a.close()
    assert instance.watches() == alone
    git("init", "-q", os.path.join(daemon_root, "s"))
    git("-C", os.path.join(daemon_root, "s"), "config", "core.pager", "p")
    assert b.update() == (hook, f"{daemon_root}/s/.git/config: core.pager = p")
    b.close()
    assert instance.watches() == 0


def test_an_overflow_of_the_shared_queue_makes_every_tracker_walk_again(two):
    (one, other), (t1, t2) = two
    max_events = int(open("/proc/sys/fs/inotify/max_queued_events").read())
    if max_events > 50_000:
        pytest.skip(f"max_queued_events is {max_events}: too many folders to make")
    for i in range(max_events + 10):
        os.mkdir(os.path.join(one, str(i)))
    # Past the overflow: the other workspace's events are not in the queue.
    git("init", "-q", os.path.join(other, "r"))
    git("-C", os.path.join(other, "r"), "config", "core.pager", "p")
    assert t2.update() == (f"{other}/r/.git/config: core.pager = p",)
    assert t1.update() == ()


def test_a_full_inbox_makes_its_tracker_walk_again_and_holds_no_more(two, instance,
                                                                     monkeypatch):
    (one, other), (t1, t2) = two
    monkeypatch.setattr(inotify, "INBOX_EVENTS", 10)
    for i in range(100):
        os.mkdir(os.path.join(other, str(i)))
    git("init", "-q", os.path.join(other, "5", "r"))
    with open(os.path.join(other, "5", "r", ".git", "hooks", "pre-push"), "w") as f:
        f.write("evil\n")
    t1.update()  # reads the queue: the other tracker's events go to its inbox
    assert instance.queued(t2) <= inotify.INBOX_EVENTS + 1
    assert t2.update() == (f"{other}/5/r/.git/hooks/pre-push",)


def test_other_sessions_traffic_leaves_a_baseline_standing_and_own_changes_do_not(
        daemon_root, instance):
    """A warm spare handed out: a session that closed (its watches' IN_IGNORED answers) and
    another's files are not the spare's changes; its own workspace's are."""
    ws = [os.path.join(daemon_root, name) for name in ("spare", "other", "closed")]
    for w in ws:
        os.makedirs(w)
    spare, other, closed = (Tracker(w, instance) for w in ws)
    for t in (spare, other, closed):
        t.start()
    closed.close()
    assert instance.pending() == 0  # read by the closing tracker, not left for the others
    assert not spare.changed()
    os.mkdir(os.path.join(ws[1], "d"))
    assert spare.changed() and spare.baseline_holds()
    git("init", "-q", os.path.join(ws[0], "r"))
    assert not spare.baseline_holds()
    spare.rebaseline()
    assert spare.update() == ()
    for t in (spare, other):
        t.close()
    assert instance.watches() == 0
