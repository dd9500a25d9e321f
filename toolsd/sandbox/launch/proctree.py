"""Find and end a whole process tree, as the host sees it. Synchronous; from trio, call it
through `trio.to_thread.run_sync`.

The tree of a pid is everything whose parent chain leads to it, whatever its process group or
session. Give a subreaper as root (a launcher shim) and keep it alive (`include_root=False`):
orphans of the tree then reparent to the root, so re-enumerating converges on everything.

Signals go through pidfds, so a pid reused after we saw it is never signalled, and exits are
waited for with poll() on those pidfds rather than by re-reading /proc on a timer.
"""

from __future__ import annotations

import os
import select
import signal
import time
from typing import NamedTuple

import psutil

# A SIGKILLed process is normally gone in microseconds; one stuck in uninterruptible sleep
# (a dead NFS mount, ...) may never go, and then it is reported as a survivor.
KILL_WAIT_S = 5.0


def _child_map() -> dict[int, list[int]]:
    """parent pid -> child pids. /proc/PID/task/*/children is not built into every kernel,
    so read every process's parent from /proc/PID/stat."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        stat = _stat(int(name))
        if stat is not None:
            children.setdefault(stat[0], []).append(int(name))
    return children


# Whether this kernel has /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN).
HAVE_CHILDREN_FILES = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def children(pid: int) -> list[int]:
    """The children of `pid`, read from its threads' /proc/PID/task/TID/children files: a
    look at that one process, however many the machine runs. Where the kernel has no such
    files, from the whole /proc (_child_map). A child forked while we read may be missed,
    so this is for callers that look again or only look (child_lookup), and for a kill,
    which walks again until nothing new is found (_TreeKiller._find)."""
    if not HAVE_CHILDREN_FILES:
        return _child_map().get(pid, [])
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue  # that thread ended meanwhile
    return found


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state letter, start tick) of a process from /proc/PID/stat; None if it
    is gone."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        try:
            stat = os.read(fd, 1024)
        finally:
            os.close(fd)
        # The command name may hold spaces and parentheses: fields start after the last ')'.
        fields = stat[stat.rindex(b")") + 2:].split(None, 20)
        return int(fields[1]), fields[0].decode(), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


class _Lookup(dict):
    """parent pid -> child pids, read from each parent's children files when asked."""

    def get(self, pid: int, default=()):
        if pid not in self:
            self[pid] = children(pid)
        return self[pid]


def child_lookup() -> dict[int, list[int]]:
    """parent pid -> child pids for looking at a few trees: read from the processes asked
    about, or, on a kernel without children files, from one walk of the whole /proc."""
    return _Lookup() if HAVE_CHILDREN_FILES else _child_map()


def _walk(roots, children: dict[int, list[int]]) -> list[int]:
    """Descendants of every root (roots themselves excluded), each once, parents first."""
    seen: set[int] = set()
    order: list[int] = []
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in seen:
                seen.add(child)
                order.append(child)
                todo.append(child)
    return order


def descendants(pid: int) -> list[psutil.Process]:
    """Every process below `pid` (zombies included), parents before their children: for
    looking (process.list, whether a process waits for input), read from the tree's own
    processes (children), not from every process of the machine."""
    found = []
    for child in _walk([pid], child_lookup()):
        try:
            found.append(psutil.Process(child))
        except psutil.NoSuchProcess:
            pass
    return found


def kill_tree(root_pid: int, *, grace_s: float, include_root: bool) -> tuple[int, int]:
    """SIGTERM every process of the tree, wait up to grace_s for them to go, SIGKILL the rest,
    and re-enumerate until none is left (a process may fork while we kill). Returns
    (ended, survivors) counted from the host's view: ended are the processes that were
    running when found and exited after (a zombie then counts as ended); one already a zombie
    when found ended on its own and is not counted."""
    killer = _TreeKiller(grace_s)
    try:
        return killer.run(root_pid, include_root)
    finally:
        killer.close()


def holders(fd: int) -> list[tuple[int, str]]:
    """(pid, name) of every other process that has the file open at our `fd`, read from the
    whole /proc: slow, for a log line when a pipe does not end as it should."""
    st = os.fstat(fd)
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            for n in os.listdir(f"/proc/{name}/fd"):
                other = os.stat(f"/proc/{name}/fd/{n}")
                if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
                    with open(f"/proc/{name}/comm") as f:
                        found.append((int(name), f.read().strip()))
                    break
        except OSError:
            continue  # gone, or not ours to look at
    return found


def _exited(pidfd: int) -> bool:
    """Whether the process of `pidfd` has exited (a zombie or reaped). poll, never select:
    the daemon holds thousands of descriptors, and select cannot take one numbered 1024 or
    more."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


class _TreeKiller:
    def __init__(self, grace_s: float):
        self.sig = signal.SIGTERM if grace_s > 0 else signal.SIGKILL
        self.deadline = time.monotonic() + max(grace_s, 0.0)
        self.running: dict[int, int] = {}  # pidfd -> pid, for processes not yet exited
        self.seen: set[int] = set()
        self.tracked = 0  # processes we held a pidfd for: those we can say we ended
        self.poller = select.poll()

    def close(self) -> None:
        for fd in self.running:
            os.close(fd)
        self.running.clear()

    def run(self, root_pid: int, include_root: bool) -> tuple[int, int]:
        first = True
        while True:
            found = self._find(root_pid, first and include_root)
            first = False
            new = [pid for pid in found if pid not in self.seen]
            self._track(new)
            self._collect(0)
            if not self.running:
                if not new:
                    break  # nothing new appeared and everything seen is gone: converged
                continue
            if self.sig == signal.SIGTERM:
                left = self.deadline - time.monotonic()
                if left > 0:
                    self._wait_all(left)
                    continue
                self.sig = signal.SIGKILL
                for fd in self.running:
                    self._signal(fd)
                continue
            if not self._wait_all(KILL_WAIT_S):
                break  # something ignores even SIGKILL (uninterruptible sleep): report it
        survivors = len(self.running)
        return self.tracked - survivors, survivors

    def _find(self, root_pid: int, with_root: bool) -> list[int]:
        # Also walk from every tracked process still running: if the root itself died, its
        # orphans went to some subreaper outside the root's tree, but their own children
        # are still theirs.
        # From the tree's own children files, not the whole /proc: a kill must not cost
        # more for every process of every other session (a session's close kills its
        # REPLs' trees). What one walk misses, the next finds, as with a walk of /proc,
        # whose listing misses what forks after it: a fork completes only in a parent that
        # has no SIGKILL pending, so a parent we saw and killed forks no more; a child forked
        # before is found below its parent, or below the root once that parent has exited
        # (it is reparented before the parent's pidfd says so), and run() walks again
        # until a walk finds nothing new and all it found has exited.
        found = _walk([root_pid, *self.running.values()], child_lookup())
        if with_root:
            # Enumerate before signalling anything: once the root is gone, its children
            # are no longer below it.
            found.insert(0, root_pid)
        return found

    def _track(self, pids) -> None:
        for pid in pids:
            self.seen.add(pid)
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue  # already reaped: it ended on its own, not by us
            if _exited(fd):
                os.close(fd)
                continue  # a zombie already: it ended on its own, not by us
            self.running[fd] = pid
            self.tracked += 1
            self.poller.register(fd, select.POLLIN)
            self._signal(fd)

    def _signal(self, fd: int) -> None:
        try:
            signal.pidfd_send_signal(fd, self.sig)
        except ProcessLookupError:
            pass  # exited between two steps; _collect sees it

    def _collect(self, timeout_ms: int) -> None:
        """Forget processes that have exited (a pidfd polls readable once its process is a
        zombie or reaped)."""
        for fd, _events in self.poller.poll(timeout_ms):
            self.poller.unregister(fd)
            self.running.pop(fd)
            os.close(fd)

    def _wait_all(self, timeout_s: float) -> bool:
        """Wait until every running process has exited or timeout_s passed; True if all did."""
        end = time.monotonic() + timeout_s
        while self.running:
            left = end - time.monotonic()
            if left <= 0:
                return False
            self._collect(max(1, int(left * 1000)))
        return True


# ---------------------------------------------------------------- what appeared since a moment
#
# A REPL call's processes are those that appeared below its interpreter's shim (a subreaper:
# orphans of the call, setsid or double-forked, come back to it) while the call ran, with
# everything below them. A process from before the call (a server an earlier call started)
# is not the call's, nor is anything it starts: the walk does not go below it.
#
# "Appeared while" is read from /proc/PID/stat's start time, in clock ticks of the boot-time
# clock. A call and a process of the call before it often fall in the same tick, so the mark
# also holds the last pid the kernel gave out: within one tick, a later pid is a later process.

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_NS_PER_TICK = 1_000_000_000 // _CLOCK_TICKS
_last_pid_fd = -1  # /proc/sys/kernel/ns_last_pid, kept open: a pread is most of a mark
_pid_max = 0


class Mark(NamedTuple):
    """A moment, as process start times can be compared with it."""

    tick: int  # boot-time clock, in the clock ticks of /proc/PID/stat's start time
    last_pid: int  # the last pid given out in our pid namespace then


def mark() -> Mark:
    """Now. Cheap (a clock read and a pread): taken for every REPL call."""
    global _last_pid_fd
    try:
        if _last_pid_fd < 0:
            _last_pid_fd = os.open("/proc/sys/kernel/ns_last_pid", os.O_RDONLY | os.O_CLOEXEC)
        # The pid first: a process started between the two reads is then later on both.
        last_pid = int(os.pread(_last_pid_fd, 32, 0))
    except (OSError, ValueError):
        last_pid = -1  # unknown: a process of the same tick is then taken for an earlier one
    return Mark(time.clock_gettime_ns(time.CLOCK_BOOTTIME) // _NS_PER_TICK, last_pid)


def _later(pid: int, tick: int, since: Mark) -> bool:
    """Whether process `pid`, started at `tick`, started after `since`."""
    if tick != since.tick or since.last_pid < 0:
        return tick > since.tick
    global _pid_max
    if not _pid_max:
        with open("/proc/sys/kernel/pid_max") as f:
            _pid_max = int(f.read())
    # Pids are given out in a cycle; within one tick a later process is a little ahead.
    return 0 < (pid - since.last_pid) % _pid_max < _pid_max // 2


def started_since(root_pid: int, keep_pid: int, since: Mark,
                  children: dict[int, list[int]] | None = None) -> list[int]:
    """The processes below `root_pid` that started after `since`, and everything below them,
    parents first; `keep_pid` (the interpreter) is passed through, not taken."""
    if children is None:
        children = _child_map()
    tops: list[int] = []
    todo = [root_pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child == keep_pid:
                todo.append(child)
                continue
            stat = _stat(child)
            if stat is not None and _later(child, stat[2], since):
                tops.append(child)
    return tops + [pid for pid in _walk(tops, children) if pid != keep_pid]


def interrupt_since(root_pid: int, keep_pid: int, since: Mark,
                    sig: int = signal.SIGINT) -> frozenset[tuple[int, int]]:
    """Send `sig` to every running process that started_since finds (as a terminal's ^C
    reaches its foreground job); returns them as (pid, start tick)."""
    sent = set()
    for pid in started_since(root_pid, keep_pid, since):
        stat = _stat(pid)
        if stat is None or stat[1] == "Z":
            continue
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            # Still the process we read: a pid freed meanwhile may be anyone's now.
            now = _stat(pid)
            if now is not None and now[2] == stat[2]:
                signal.pidfd_send_signal(fd, sig)
                sent.add((pid, stat[2]))
        except OSError:
            pass
        finally:
            os.close(fd)
    return frozenset(sent)


def end_since(root_pid: int, keep_pid: int, since: Mark, *, grace_s: float,
              interrupted: frozenset[tuple[int, int]] = frozenset()) -> tuple[int, int]:
    """End what started_since finds as kill_tree ends a tree (SIGTERM, grace_s, SIGKILL, until
    nothing new appears), sparing `keep_pid` and what was there before `since`.
    (ended, survivors); ended also counts the processes of `interrupted` that ended since."""
    dying = set()  # interrupted, and not yet ended: by us now, or by that signal meanwhile
    for pid, tick in interrupted:
        stat = _stat(pid)
        if stat is not None and stat[1] != "Z" and stat[2] == tick:
            dying.add(pid)
    killer = _SinceKiller(grace_s, keep_pid, since)
    try:
        ended, survivors = killer.run(root_pid, False)
    finally:
        killer.close()
    # Those the killer did not find running had ended: it stops only when nothing is left.
    return ended + len(interrupted) - len(dying & killer.tracked_pids), survivors


class _SinceKiller(_TreeKiller):
    def __init__(self, grace_s: float, keep_pid: int, since: Mark):
        super().__init__(grace_s)
        self.keep_pid = keep_pid
        self.since = since
        self.tracked_pids: set[int] = set()  # those found running, which `tracked` counts

    def _track(self, pids) -> None:
        before = set(self.running.values())
        super()._track(pids)
        self.tracked_pids |= set(self.running.values()) - before

    def _find(self, root_pid: int, with_root: bool) -> list[int]:
        children = _child_map()
        found = started_since(root_pid, self.keep_pid, self.since, children)
        # Also below what is being ended: a process that left the root's tree meanwhile.
        return list(dict.fromkeys(found + _walk(list(self.running.values()), children)))
