"""`waiting_for_input` of a background process: read what the kernel says about the processes
that would read its input (input_wait_rules.py decides). Blocking /proc reads: call
`waiting` and `switches_now`, which run them in a worker thread.

Who could read the input: on a terminal, the processes of the tree in the terminal's
foreground process group (what a shell's job control lets read it); on a pipe, every process
of the tree that holds the pipe's read end.
"""

from __future__ import annotations

import fcntl
import functools
import os
import struct
from typing import NamedTuple

import trio

from toolsd.runtime import threads
from toolsd.sandbox.launch import proctree
from toolsd.tools.input_wait_rules import (
    MAX_WATCHED,
    ProcessView,
    blocked_call,
    epoll_read_fds,
    group_of,
    is_waiting,
    last_pid,
    poll_read_fds,
    select_read_fds,
    terminal_of,
    waits_alone,
)

MACHINE = os.uname().machine
# Looks at once, at most: each reads a few files per process of one tree.
LOOK_THREADS = 2
# The number of a pty master's terminal: _IOR('T', 0x30, unsigned int), which Python's
# termios does not name; the same on x86_64 and aarch64.
TIOCGPTN = 0x80045430
DEV_TTY = os.makedev(5, 0)  # /dev/tty


class Tree(NamedTuple):
    """The pids below a shim, found when the machine's last pid was `mark`."""

    mark: str
    pids: tuple[int, ...]


class Look(NamedTuple):
    """What one look found: the views, whether they are every process that could read the
    input (False: only the first one, which was enough), and the tree it used."""

    views: list[ProcessView]
    complete: bool
    tree: Tree | None


def waiting_now(proc) -> bool | None:
    """`waiting` when it needs no look at the process's tree (it has no input open, is not
    running, or has input still unread); else None."""
    source = proc.input
    if source is None or not source.open or not proc.running or source.pending():
        return False
    return None


async def waiting(proc) -> bool:
    """Whether BackgroundProcess `proc` waits for input now (false without input)."""
    known = waiting_now(proc)
    if known is not None:
        return known
    source = proc.input
    with proc.job.holding_tree() as shim_pid:
        if shim_pid is None:
            return False
        look = await trio.to_thread.run_sync(
            functools.partial(_look, shim_pid, source.fd, source.terminal, first=proc.job.pid,
                              before_write=source.before_write, tree=source.tree),
            limiter=threads.limiter("input", LOOK_THREADS))
    source.tree = look.tree or source.tree
    if not look.complete:
        source.before_write = None  # the first process saw every write (waits_alone)
        return True
    views = look.views
    if source.before_write and not any(source.before_write.get(v.pid) == v.switches
                                       for v in views):
        source.before_write = None  # every reader has run since: the write reached them
    return is_waiting(views, MACHINE, before_write=source.before_write)


async def switches_now(proc) -> dict[int, int]:
    """Context switches of the processes that could read `proc`'s input, by pid."""
    with proc.job.holding_tree() as shim_pid:
        if shim_pid is None or not proc.input.open:
            return {}
        look = await trio.to_thread.run_sync(
            functools.partial(_look, shim_pid, proc.input.fd, proc.input.terminal, False,
                              tree=proc.input.tree),
            limiter=threads.limiter("input", LOOK_THREADS))
    proc.input.tree = look.tree or proc.input.tree
    return {v.pid: v.switches for v in look.views}


def _look(shim_pid: int, fd: int, terminal: bool, full: bool = True, *, first: int = -1,
          before_write: dict[int, int] | None = None, tree: Tree | None = None) -> Look:
    """Views of the processes below `shim_pid` that could read the input `fd` (our end).
    With `first` (the command's pid; on a terminal its foreground group's leader is taken
    instead) and `full`: that process alone first, and no walk of the tree when it shows the
    wait by itself (input_wait_rules.waits_alone). `tree`: the last look's, reused while no process
    was made since."""
    try:
        if terminal:
            group = os.tcgetpgrp(fd)
            number = struct.unpack("I", fcntl.ioctl(fd, TIOCGPTN, b"\0" * 4))[0]
            device = os.makedev(136 + number // 256, number % 256)  # UNIX98 pty slaves

            def is_input(pid: int, link: str, n: int) -> bool:
                rdev = os.stat(f"/proc/{pid}/fd/{n}").st_rdev
                # /dev/tty is whichever terminal controls the process: ours, or another.
                return rdev == device or (rdev == DEV_TTY and terminal_of(
                    _read(f"/proc/{pid}/stat")) == device)
            # Only the foreground group may read a terminal: its leader, if still there, is
            # the one a prompt is usually in.
            first = group
        else:
            group = None
            link_text = f"pipe:[{os.fstat(fd).st_ino}]"

            def is_input(pid: int, link: str, n: int) -> bool:
                return link == link_text
    except OSError:
        return Look([], True, None)
    if full and first > 0:
        try:
            view = _view(first, is_input, True)
        except OSError:
            view = None  # gone: look at the tree
        if (view is not None and (group is None or group_of(view.stat) == group)
                and waits_alone(view, MACHINE, before_write)):
            return Look([view], False, None)
    tree = _tree(shim_pid, tree)
    pids = tree.pids
    if terminal:
        pids = [pid for pid in pids if _pgid(pid) == group]
    views = []
    for pid in pids:
        try:
            views.append(_view(pid, is_input, full))
        except OSError:
            continue  # gone while we looked
    return Look(views, True, tree)


def _tree(shim_pid: int, known: Tree | None) -> Tree:
    """The pids below `shim_pid`: `known`'s while no process was made on the machine since
    it was found (one that left is skipped when read; a pid taken again is a process made),
    else from a walk of /proc. The mark is read before the walk, so that a process made
    during it makes the next look walk again."""
    mark = last_pid(_read("/proc/loadavg"))
    if known is not None and mark and known.mark == mark:
        return known
    return Tree(mark, tuple(p.pid for p in proctree.descendants(shim_pid)))


def _view(pid: int, is_input, full: bool) -> ProcessView:
    base = f"/proc/{pid}"
    status = _read(f"{base}/status")
    switches = sum(int(line.split()[1]) for line in status.splitlines()
                   if "ctxt_switches:" in line)
    if not full:
        return ProcessView(pid, "", "", "", frozenset(), None, switches)
    stat, syscall, wchan = _read(f"{base}/stat"), _read(f"{base}/syscall"), _read(f"{base}/wchan")
    inputs = set()
    for name in os.listdir(f"{base}/fd"):
        try:
            if is_input(pid, os.readlink(f"{base}/fd/{name}"), int(name)):
                inputs.add(int(name))
        except (OSError, ValueError):
            continue
    watched = None
    wait = blocked_call(syscall, MACHINE)
    if inputs and wait is not None and wait.kind != "read":
        try:
            watched = _watched(base, wait)
        except (OSError, ValueError, OverflowError):
            watched = None
    return ProcessView(pid, stat, syscall, wchan, frozenset(inputs), watched, switches)


def _watched(base: str, wait) -> frozenset[int]:
    if wait.kind == "epoll":
        return epoll_read_fds(_read(f"{base}/fdinfo/{wait.first}"))
    if wait.address == 0:
        return frozenset()
    size = ((min(wait.first, MAX_WATCHED) + 7) // 8 if wait.kind == "select"
            else 8 * min(wait.first, MAX_WATCHED))
    with open(f"{base}/mem", "rb", buffering=0) as mem:
        mem.seek(wait.address)
        data = mem.read(size)
    return select_read_fds(data, wait.first) if wait.kind == "select" else poll_read_fds(data)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _read(path: str) -> str:
    with open(path, "rb", buffering=0) as f:
        return f.read(4096).decode(errors="replace")
