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
        try:
            fd = os.open(f"/proc/{name}/stat", os.O_RDONLY)
            try:
                stat = os.read(fd, 1024)
            finally:
                os.close(fd)
            # The command name may hold spaces and parentheses: fields start after the last ')'.
            ppid = int(stat[stat.rindex(b")") + 2:].split(None, 2)[1])
        except (OSError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    return children


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
    """Every process below `pid` (zombies included), parents before their children."""
    found = []
    for child in _walk([pid], _child_map()):
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
            # Also walk from every tracked process still running: if the root itself died, its
            # orphans went to some subreaper outside the root's tree, but their own children
            # are still theirs.
            roots = [root_pid, *self.running.values()]
            found = _walk(roots, _child_map())
            if first and include_root:
                # Enumerate before signalling anything: once the root is gone, its children
                # are no longer below it.
                found.insert(0, root_pid)
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

    def _track(self, pids) -> None:
        for pid in pids:
            self.seen.add(pid)
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue  # already reaped: it ended on its own, not by us
            if select.select([fd], [], [], 0)[0]:
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
