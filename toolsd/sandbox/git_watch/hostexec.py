"""What in a session's workspace the host's git would execute, that the session added.

A session can write any repository of its workspace except the top-level one's hooks and
config (read-only: policy.py). A hook, or a setting that names a program (gitconfig.py,
RUNS_CODE), in a repository the session made (`git init`, a clone) or in one below the top
level runs on the host the next time a person runs git there. These are not made read-only
as they appear: a mount over them would also keep the session from removing a repository
it made, or from setting its remote. They are reported instead, in every call's result
(`host_exec`), so that the agent backend and a person see them before the host's git runs
them (docs/sandbox.md, "What the host would execute").

How repositories are found without walking the workspace on every call: the workspace is
walked once when the session starts (its repositories then are the baseline), with an
inotify watch on every folder; afterwards only the folders that the kernel says changed are
looked at. The repositories' own folders (the git dir, its hooks/) are watched too, so an
unchanged workspace costs one poll per call.

The watches are on the daemon's one inotify instance (inotify.py), shared by every
session: a user has only `fs.inotify.max_user_instances` of them. A Tracker's watches are
its own to count (MAX_WATCHES) and to release; two sessions watching the same folder share
the kernel's watch, and each gets its events.

Resource handling: a Tracker owns its watches on the shared instance; `close()` releases
them (never the instance). Its methods do blocking I/O: the session runs `start` and
`update` in a worker thread, one at a time; `current` and `changed` are cheap and safe from
the event loop.
"""

from __future__ import annotations

import errno
import logging
import os
import threading

from toolsd.sandbox.git_watch import inotify
from toolsd.sandbox.git_watch.gitrepo import Repo, inside, is_gitdir, read_gitfile

log = logging.getLogger("toolsd.hostexec")

_IN_MODIFY = 0x2
_IN_ATTRIB = 0x4
_IN_CLOSE_WRITE = 0x8
_IN_MOVED_FROM = 0x40
_IN_MOVED_TO = 0x80
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_DELETE_SELF = 0x400
_IN_IGNORED = inotify.IN_IGNORED
_IN_ONLYDIR = 0x1000000
_IN_DONT_FOLLOW = 0x2000000
_IN_EXCL_UNLINK = 0x4000000
_IN_ISDIR = 0x40000000

# A folder of the worktree: entries made, moved or removed (not file writes: a build would
# flood the queue). A git dir or hooks folder: every change.
_TREE_MASK = (_IN_CREATE | _IN_MOVED_TO | _IN_MOVED_FROM | _IN_DELETE | _IN_DELETE_SELF
              | _IN_ONLYDIR | _IN_DONT_FOLLOW | _IN_EXCL_UNLINK)
_GIT_MASK = _TREE_MASK | _IN_MODIFY | _IN_CLOSE_WRITE | _IN_ATTRIB
# Most bytes of events read, and most events taken in, from the event loop (update_now);
# more wait for a worker thread.
_READ_NOW = 64 * 1024
_TAKE_NOW = 1024

# Names whose appearance in a folder may make it a bare repository (or a git dir).
_GITDIR_NAMES = frozenset({"HEAD", "config", "objects", "refs", "commondir", "gitdir"})
# Names in a git dir that change what it would run.
_WATCHED_IN_GITDIR = frozenset({"config", "config.worktree", "hooks", "commondir"})
# Most folders watched for one session. Watches are the user's (fs.inotify.max_user_watches,
# shared by every program of the daemon's user): a session making folders without end must
# not take them all. Past it, what is made below folders not watched is not seen, and the
# report says so.
MAX_WATCHES = 50_000


class Tracker:
    """The repositories of one workspace and what the session added to them (see the
    module's docstring). Built by `start()`, brought up to date by `update()`. Its
    watches are on `instance` (the daemon's shared one unless given)."""

    def __init__(self, workspace: str, instance: inotify.Inotify | None = None):
        self.workspace = workspace
        self.found: tuple[str, ...] = ()  # the report: replaced whole, read from any thread
        self.complete = True  # False once a folder could not be watched (see start)
        self._inotify = instance or inotify.shared()
        self._watching = False  # from start() to close()
        self._lock = threading.Lock()
        self._wd_path: dict[int, str] = {}
        self._path_wd: dict[str, int] = {}
        # Watches of git dirs and hooks folders: (repo, a hooks folder: any change counts)
        self._wd_repo: dict[int, tuple[Repo, bool]] = {}
        self._repos: dict[str, Repo] = {}  # git dir -> repo
        self._baseline: dict[tuple[int, int], frozenset] = {}  # git dir identity -> items
        self._new_dirs: list[str] = []
        self._rescan = False

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Watch the workspace and take its repositories as they are now as the baseline."""
        with self._lock:
            self._watching = True
            self._walk(self.workspace)
            self._settle()
            self.rebaseline_locked()

    def close(self) -> None:
        """Release this session's watches (the kernel's, where no other session shares
        them); events still queued for it are dropped."""
        with self._lock:
            self._watching = False
            wds, self._wd_path, self._path_wd, self._wd_repo = list(self._wd_path), {}, {}, {}
            self._inotify.leave(self, wds)

    def rebaseline(self) -> None:
        """What is there now is the baseline (a sandbox made ahead, handed to a session)."""
        with self._lock:
            if self._watching:
                self._read_events()
                self._settle()
            self.rebaseline_locked()

    def baseline_holds(self) -> bool:
        """Whether the baseline is as `rebaseline` would take it, found without a worker
        thread: the shared queue read (as update_now does) and none of its events this
        session's. The shared queue is seldom empty when a spare is handed out: the session
        closed before it removed its watches, and their IN_IGNORED answers are queued. False
        when something must be looked at, or the queue could not be read now: then run
        `rebaseline`."""
        if not self._lock.acquire(blocking=False):
            return False  # an update is running in a thread
        try:
            if not self._watching:
                return True  # as changed(): no watches, nothing to take in
            return (self._inotify.pump(limit=_READ_NOW, wait=False)
                    and self._inotify.queued(self) == 0 and not self._unsettled())
        finally:
            self._lock.release()

    def rebaseline_locked(self) -> None:
        self._baseline = {}
        for repo in self._repos.values():
            repo.locate()
            if repo.identity is not None:
                self._baseline[repo.identity] = frozenset(repo.items())
            repo.lines = []
            repo.dirty = False
        self._report()

    # ------------------------------------------------------------ per call

    def changed(self) -> bool:
        """Whether `update` has anything to do (cheap: one ioctl, no reading): events not
        read yet (the shared queue's: perhaps some are this session's), read and not taken
        yet, or taken (update_now) and not looked at yet."""
        return self._watching and (self._inotify.pending() > 0 or self._inotify.queued(self) > 0
                                   or self._unsettled())

    def _unsettled(self) -> bool:
        return bool(self._new_dirs) or self._rescan or any(r.dirty for r in self._repos.values())

    def update_now(self) -> tuple[str, ...] | None:
        """`update` if what changed is cheap to take in (files made or removed: most calls
        make some), without a worker thread; None if it is not (folders to walk,
        repositories to read, more events queued than `_READ_NOW`, another session reading
        them), and `update` must run."""
        if not self._lock.acquire(blocking=False):
            return None  # an update is running in a thread
        try:
            if not self._watching:
                return self.found
            if (not self._inotify.pump(limit=_READ_NOW, wait=False)
                    or self._inotify.queued(self) > _TAKE_NOW):
                return None
            self._take_events()
            if self._unsettled():
                return None
            return self._report()
        finally:
            self._lock.release()

    def update(self) -> tuple[str, ...]:
        """Take in what changed since the last call; the report (also in `found`)."""
        with self._lock:
            if not self._watching:
                return self.found
            self._read_events()
            self._settle()
            for repo in list(self._repos.values()):
                if repo.dirty:
                    repo.dirty = False
                    repo.locate()
                    if not is_gitdir(repo.gitdir):
                        self._forget_repo(repo)
                        continue
                    base = self._baseline.get(repo.identity, frozenset())
                    repo.lines = sorted(line for item, line in repo.items().items()
                                        if item not in base)
            return self._report()

    def _report(self) -> tuple[str, ...]:
        lines = sorted(line for r in self._repos.values() for line in r.lines)
        if not self.complete:
            lines.append(f"[toolsd: not every folder of {self.workspace} is watched (too many; "
                         f"the daemon's log says which): hooks and settings in repositories "
                         f"made there are not listed here]")
        self.found = tuple(lines)
        return self.found

    # ------------------------------------------------------------ watching

    def _watch(self, path: str, mask: int) -> int | None:
        if len(self._wd_path) >= MAX_WATCHES:
            self._incomplete(f"more than {MAX_WATCHES} folders", path)
            return None
        try:
            wd = self._inotify.subscribe(self, path, mask)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                self._incomplete("the user's inotify watches (fs.inotify.max_user_watches) "
                                 "all taken", path)
            elif e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
                self._incomplete(str(e), path)
            return None
        self._wd_path[wd] = path
        self._path_wd[path] = wd
        return wd

    def _incomplete(self, why: str, path: str) -> None:
        if self.complete:
            self.complete = False
            log.warning("%s: %s; what is made below %s and other folders not watched is not "
                        "reported", self.workspace, why, path)

    def _walk(self, top: str) -> None:
        """Watch `top` and every folder below it (not into git dirs); note repositories.
        Folders watched already are walked through (after an overflow: what is not watched
        yet gets its watch)."""
        stack = [top]
        while stack:
            folder = stack.pop()
            if folder not in self._path_wd and self._watch(folder, _TREE_MASK) is None:
                continue
            below, head = [], False
            try:
                with os.scandir(folder) as it:
                    for e in it:
                        if e.name == ".git":
                            self._found_dotgit(e.path)
                        elif e.is_dir(follow_symlinks=False):
                            below.append(e.path)
                        elif e.name == "HEAD":
                            head = True
            except OSError:
                continue
            if head and is_gitdir(folder):
                self._add_repo(folder)  # a bare repository: its folders are git's
                continue
            stack += below

    def _found_dotgit(self, path: str) -> None:
        if os.path.isdir(path) and not os.path.islink(path):
            if is_gitdir(path):
                self._add_repo(path)
            elif path not in self._path_wd:
                self._watch(path, _TREE_MASK)  # made empty: git init may fill it later
            return
        gitdir = read_gitfile(path)
        if gitdir is not None and inside(gitdir, self.workspace) and is_gitdir(gitdir):
            self._add_repo(gitdir)

    def _add_repo(self, gitdir: str) -> None:
        """Note a git dir (again: its hooks folder may be new) and watch its folders."""
        gitdir = os.path.realpath(gitdir)
        repo = self._repos.get(gitdir)
        if repo is None:
            repo = self._repos[gitdir] = Repo(gitdir, self.workspace)
        repo.locate()
        for folder in dict.fromkeys((repo.gitdir, repo.common, repo.hooks)):
            known = self._path_wd.get(folder)
            if (inside(folder, self.workspace) and os.path.isdir(folder)
                    and (known is None or known not in self._wd_repo)):
                wd = self._watch(folder, _GIT_MASK)  # replaces a worktree watch's mask
                if wd is not None:
                    self._wd_repo[wd] = (repo, folder == repo.hooks)
        repo.dirty = True

    def _forget_repo(self, repo: Repo) -> None:
        self._repos.pop(repo.gitdir, None)
        for wd, (r, _hooks) in list(self._wd_repo.items()):
            if r is repo:
                del self._wd_repo[wd]
                self._unwatch(wd)

    def _unwatch(self, wd: int) -> None:
        path = self._wd_path.pop(wd, None)
        if path is not None and self._path_wd.get(path) == wd:
            del self._path_wd[path]
        self._inotify.unsubscribe(self, wd)

    def _forget_below(self, top: str, *, watches: bool) -> None:
        """A folder moved away or removed: drop the repositories at and below it, and (moved:
        their paths are stale; removed ones end by themselves, IN_IGNORED) the watches.
        Moved within the workspace, it comes back as new where it lands."""
        if watches:
            for path, wd in list(self._path_wd.items()):
                if inside(path, top):
                    self._wd_repo.pop(wd, None)
                    self._unwatch(wd)
        for gitdir, repo in list(self._repos.items()):
            if inside(gitdir, top):
                self._forget_repo(repo)

    def _read_events(self) -> None:
        """Everything queued when called, this session's events among it (a call over:
        all it caused), taken in."""
        self._inotify.pump()
        self._take_events()

    def _take_events(self) -> None:
        events, lost = self._inotify.take(self)
        if lost:
            self._rescan = True  # the shared queue overflowed, or this session's inbox
        for wd, mask, name in events:
            self._event(wd, mask, name)

    def _event(self, wd: int, mask: int, name: str) -> None:
        if mask & _IN_IGNORED:
            self._wd_repo.pop(wd, None)
            path = self._wd_path.pop(wd, None)
            if path is not None and self._path_wd.get(path) == wd:
                del self._path_wd[path]
            return
        owner = self._wd_repo.get(wd)
        if owner is not None:
            repo, hooks = owner
            if hooks or name in _WATCHED_IN_GITDIR:
                repo.dirty = True
            if name == "hooks" and mask & (_IN_CREATE | _IN_MOVED_TO):
                self._new_dirs.append(repo.gitdir)  # watch the new hooks folder
            if not hooks and mask & _IN_ISDIR and name == "hooks" and mask & (
                    _IN_MOVED_FROM | _IN_DELETE):
                repo.dirty = True
            return
        folder = self._wd_path.get(wd)
        if folder is None or not name:
            return
        path = os.path.join(folder, name)
        if mask & (_IN_CREATE | _IN_MOVED_TO):
            if name == ".git" or mask & _IN_ISDIR:
                self._new_dirs.append(path)
            if name in _GITDIR_NAMES:
                self._new_dirs.append(folder)  # perhaps a bare repository, or .git filled
        if mask & (_IN_MOVED_FROM | _IN_DELETE) and (mask & _IN_ISDIR or name == ".git"):
            self._forget_below(path, watches=bool(mask & _IN_MOVED_FROM))

    def _settle(self) -> None:
        """Look at what the events pointed to: new folders (walked and watched), new `.git`
        entries, folders that may have become git dirs. After an overflow, everything."""
        if self._rescan:
            self._rescan = False
            self._walk(self.workspace)
            for repo in self._repos.values():
                repo.dirty = True
        todo, self._new_dirs = self._new_dirs, []
        # Parents first: a .git made and filled since the last look is a repository by the
        # time its own folders come up, and those are then left alone.
        for path in sorted(set(todo), key=len):
            if path in self._repos:
                self._add_repo(path)
            elif any(inside(path, gitdir) for gitdir in self._repos):
                continue
            elif os.path.basename(path) == ".git":
                self._add_repo(path)
            elif os.path.basename(path) == ".git":
                self._found_dotgit(path)
            elif path in self._path_wd:
                if is_gitdir(path):
                    self._add_repo(path)
            elif os.path.isdir(path) and not os.path.islink(path):
                self._walk(path)
