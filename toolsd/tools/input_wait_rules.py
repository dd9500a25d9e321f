"""Whether a process waits for input, from what the kernel says about it: pure functions over
the texts of /proc/PID/stat, /proc/PID/syscall and /proc/PID/wchan (and, for a wait on many
descriptors, the ones it watches). No I/O here: input_wait.py reads those files.

A process waits for input when it sleeps in a system call that reads, or waits to read, one of
the descriptors that are its input (its terminal, or the stdin pipe), and nothing written to
that input is still on its way to it. A process that runs (a busy loop) is never waiting: the
kernel shows its state as R and its syscall file says "running".
"""

from __future__ import annotations

import re
import sys
from typing import NamedTuple

# System call numbers by machine (`uname -m`): those that read one descriptor (its number is
# the first argument), and those that wait on several.
_SYSCALLS = {
    "x86_64": {
        "read": {0, 17, 19, 295, 327},  # read, pread64, readv, preadv, preadv2
        "select": {23, 270},  # select, pselect6: (nfds, readfds, ...)
        "poll": {7, 271},  # poll, ppoll: (fds, nfds, ...)
        "epoll": {232, 281, 441},  # epoll_wait, epoll_pwait, epoll_pwait2: (epfd, ...)
    },
    "aarch64": {
        "read": {63, 65, 67, 69, 286},
        "select": {72},
        "poll": {73},
        "epoll": {22, 441},
    },
}
# Most entries of a poll array or bits of a select set looked at; a program that waits on
# more than this has its input watched by something else than a plain prompt.
MAX_WATCHED = 1024
POLLIN = 0x1
EPOLLIN = 0x1
# A process asleep in /proc/PID/stat: interruptibly, as a read is. Stopped (T, Ctrl-Z),
# traced, or in disk sleep (D) is no wait for input.
SLEEPING = {"S"}


class Wait(NamedTuple):
    """What a sleeping process waits in: `kind` "read" (fd `first`), "select" (`first` fds,
    their read set at `address`), "poll" (`first` entries at `address`), "epoll" (epoll
    descriptor `first`)."""

    kind: str
    first: int
    address: int


class ProcessView(NamedTuple):
    """One process as input_wait.py read it. `input_fds`: its descriptors that are the
    process's input. `watched`: for a select, poll or epoll wait, the descriptors it waits to
    read (None when unknown). `switches`: its context switches so far."""

    pid: int
    stat: str
    syscall: str
    wchan: str
    input_fds: frozenset[int]
    watched: frozenset[int] | None
    switches: int


def state_of(stat: str) -> str:
    """The state letter of a /proc/PID/stat text ("" if unreadable)."""
    head, _, rest = stat.rpartition(")")
    return rest.split(None, 1)[0] if head and rest.strip() else ""


def group_of(stat: str) -> int | None:
    """The process group of a /proc/PID/stat text (None if unreadable)."""
    head, _, rest = stat.rpartition(")")
    fields = rest.split(None, 3)
    try:
        return int(fields[2]) if head else None
    except (IndexError, ValueError):
        return None


def terminal_of(stat: str) -> int | None:
    """The controlling terminal of a /proc/PID/stat text (`tty_nr`, a device number as
    os.makedev makes it; 0 for none), None if unreadable. A descriptor of /dev/tty (device
    5:0: ssh's, sudo's, getpass's prompts open it) reads that terminal."""
    head, _, rest = stat.rpartition(")")
    fields = rest.split(None, 5)
    try:
        return int(fields[4]) if head else None
    except (IndexError, ValueError):
        return None


def last_pid(loadavg: str) -> str:
    """The last pid the kernel handed out, from a /proc/loadavg text: it moves on every
    process or thread made anywhere, so an unchanged one means no process is new since."""
    fields = loadavg.split()
    return fields[4] if len(fields) == 5 else ""


def blocked_call(syscall: str, machine: str) -> Wait | None:
    """What a /proc/PID/syscall text says the process waits in, if it is a read or a wait to
    read; None for anything else ("running", another call, an unknown machine)."""
    fields = syscall.split()
    numbers = _SYSCALLS.get(machine)
    if numbers is None or len(fields) < 4:
        return None
    try:
        nr, first, second = int(fields[0]), int(fields[1], 16), int(fields[2], 16)
    except ValueError:
        return None
    if nr in numbers["read"]:
        return Wait("read", first, 0)
    if nr in numbers["select"]:
        return Wait("select", first, second)
    if nr in numbers["poll"]:
        return Wait("poll", second, first)
    if nr in numbers["epoll"]:
        return Wait("epoll", first, 0)
    return None


def select_read_fds(bitmap: bytes, nfds: int) -> frozenset[int]:
    """The descriptors set in a select() read set (a little-endian bit array of `nfds` bits,
    as Linux lays out fd_set)."""
    nfds = min(nfds, MAX_WATCHED, len(bitmap) * 8)
    return frozenset(fd for fd in range(nfds) if bitmap[fd // 8] >> (fd % 8) & 1)


def poll_read_fds(entries: bytes) -> frozenset[int]:
    """The descriptors a poll() array waits to read: struct pollfd is (int fd, short events,
    short revents), native byte order."""
    found = set()
    for i in range(0, len(entries) - 7, 8):
        fd = int.from_bytes(entries[i:i + 4], sys.byteorder, signed=True)
        events = int.from_bytes(entries[i + 4:i + 6], sys.byteorder)
        if fd >= 0 and events & POLLIN:
            found.add(fd)
    return frozenset(found)


_EPOLL_TARGET = re.compile(r"^tfd:\s*(\d+)\s+events:\s*([0-9a-fA-F]+)", re.M)


def epoll_read_fds(fdinfo: str) -> frozenset[int]:
    """The descriptors an epoll instance waits to read, from its /proc/PID/fdinfo text."""
    return frozenset(int(fd) for fd, events in _EPOLL_TARGET.findall(fdinfo)
                     if int(events, 16) & EPOLLIN)


def reads_input(view: ProcessView, machine: str) -> bool:
    """Whether this process sleeps reading (or waiting to read) its input."""
    if state_of(view.stat) not in SLEEPING or not view.input_fds:
        return False
    if view.wchan.strip() in ("", "0"):
        return False  # not asleep in the kernel after all: it moved on since the stat
    wait = blocked_call(view.syscall, machine)
    if wait is None:
        return False
    if wait.kind == "read":
        return wait.first in view.input_fds
    return view.watched is not None and bool(view.watched & view.input_fds)


def is_waiting(views: list[ProcessView], machine: str, *, pending: int = 0,
               before_write: dict[int, int] | None = None) -> bool:
    """Whether the process waits for input: one of `views` (its terminal's foreground group,
    or the readers of its stdin pipe) sleeps reading its input, and nothing written is on its
    way. `pending`: bytes written that no reader has taken yet, as the kernel counts them (a
    pipe's). `before_write`: context switches of each process just before the last write
    that should have woken a reader: one still at that count has not seen it yet."""
    if pending > 0:
        return False
    readers = [v for v in views if reads_input(v, machine)]
    if not readers:
        return False
    if before_write and any(before_write.get(v.pid) == v.switches for v in readers):
        return False
    return True


def waits_alone(view: ProcessView, machine: str,
                before_write: dict[int, int] | None = None) -> bool:
    """Whether this one process shows the wait whatever the others that could read the input
    do: is_waiting over any views that hold this one then says true too. It must read its
    input, and a write still on its way may only be this process's to see (a write another
    process has not seen yet is decided over all of them)."""
    if before_write and set(before_write) - {view.pid}:
        return False
    return is_waiting([view], machine, before_write=before_write)
