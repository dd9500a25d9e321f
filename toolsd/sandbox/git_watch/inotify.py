"""The daemon's one inotify instance, shared by every session's hostexec.Tracker.

Why one: the kernel gives a user at most `fs.inotify.max_user_instances` instances (often
128), shared by every program of that user; one per session would leave the sessions past
that number with no watch at all. Watches stay per session (each tracker's own, counted
against its own cap); only the descriptor and its event queue are shared.

The kernel gives one watch descriptor (wd) per inode and instance: two sessions watching the
same folder (the same workspace, or nested ones) get the same wd. So a wd here has a set of
subscribers, each with the mask it asked for; the kernel's mask is their union (IN_MASK_ADD:
it only grows while the watch lives, and an event goes only to the subscribers whose mask
has it). The kernel watch is removed when its last subscriber leaves.

Events are read by whoever asks first (`pump`), never by a thread of its own: a session
looking after its call reads everything queued at that moment, which includes all that its
call caused, and hands each event to the inboxes of its wd's subscribers. An inbox holds at
most INBOX_EVENTS; past it (or when the kernel's shared queue overflows, IN_Q_OVERFLOW) the
subscriber is told it lost events and walks its workspace again.

IN_IGNORED (the watch is gone: its folder was removed, or we removed it) goes to every
subscriber whatever its mask, and ends the wd here, so that the number can be handed out
again. One that answers our own `inotify_rm_watch` comes after we forgot the wd: it is
counted when we remove, and swallowed when it arrives, so that it never ends a later watch
that got the same number. (The kernel hands numbers out cyclically: one whose watch the
kernel ended by itself comes back only after some 2**31 others, long after its IN_IGNORED
was read.)

Resource handling: the descriptor is opened by the first `subscribe` and kept for the life
of the process (close-on-exec); a listener's `leave` releases its watches and inbox.
Thread safety: one lock over the descriptor, the table and the inboxes; a caller may hold
its own lock while calling in, never the other way round.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import struct
import sys
import termios
import threading

IN_ALL_EVENTS = 0xFFF
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
_IN_MASK_ADD = 0x20000000
_EVENT = struct.Struct("iIII")

# Events held for one subscriber that has not looked yet. Past it, its events are dropped
# and it walks its workspace again: a session whose processes churn files while no call
# looks must not grow the daemon's memory without end.
INBOX_EVENTS = 16_384

_libc = None


def _c():
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        _libc = libc
    return _libc


class Inotify:
    """One inotify descriptor, who listens to which of its watches, and each listener's
    inbox (see the module's docstring). A listener is any hashable object (a Tracker)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._fd = -1
        self._subscribers: dict[int, dict[object, int]] = {}  # wd -> listener -> mask
        self._inboxes: dict[object, list[tuple[int, int, str]]] = {}  # (wd, mask, name)
        self._lost: set[object] = set()  # listeners whose events were dropped
        self._retired: dict[int, int] = {}  # wd -> IN_IGNORED we caused, not read yet

    # ------------------------------------------------------------ watches

    def subscribe(self, who: object, path: str, mask: int) -> int:
        """Watch `path` for `who`; its wd. Raises OSError (ENOSPC: the user's watches are
        all taken; EMFILE: the user's instances are, and this is the first watch)."""
        with self.lock:
            self._open_locked()
            wd = _c().inotify_add_watch(self._fd, os.fsencode(path), mask | _IN_MASK_ADD)
            if wd < 0:
                code = ctypes.get_errno()
                raise OSError(code, os.strerror(code), path)
            subs = self._subscribers.setdefault(wd, {})
            subs[who] = subs.get(who, 0) | mask
            self._inboxes.setdefault(who, [])
            return wd

    def open(self) -> None:
        """Take the descriptor now (the daemon does at start, while the user's instances are
        not all taken by other programs). Raises OSError as subscribe does."""
        with self.lock:
            self._open_locked()

    def _open_locked(self) -> None:
        if self._fd == -1:
            fd = _c().inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                code = ctypes.get_errno()
                raise OSError(code, f"no inotify instance: {os.strerror(code)}")
            self._fd = fd

    def unsubscribe(self, who: object, wd: int) -> None:
        with self.lock:
            self._unsubscribe_locked(who, wd)

    def leave(self, who: object, wds) -> None:
        """`who` is done: its watches `wds` are released, its inbox dropped."""
        removed = False
        for wd in wds:
            with self.lock:  # a lock per watch: a big workspace must not stall the others
                removed |= self._unsubscribe_locked(who, wd)
        with self.lock:
            self._inboxes.pop(who, None)
            self._lost.discard(who)
        if removed:
            # The kernel's IN_IGNORED answers are queued by now: read them here (a worker
            # thread of the closing session) rather than leave the queue looking busy to
            # every other session's next look, and a warm spare's hand-out.
            self.pump()

    def _unsubscribe_locked(self, who: object, wd: int) -> bool:
        """Whether the kernel's watch was removed (its IN_IGNORED is queued)."""
        subs = self._subscribers.get(wd)
        if subs is None or subs.pop(who, None) is None or subs:
            return False  # not its (any more), or others still listen
        del self._subscribers[wd]
        if _c().inotify_rm_watch(self._fd, wd) == 0:
            self._retired[wd] = self._retired.get(wd, 0) + 1
            return True
        return False  # the kernel ended it already: its IN_IGNORED, queued, finds no subscriber

    def watches(self) -> int:
        """Kernel watches held."""
        with self.lock:
            return len(self._subscribers)

    # ------------------------------------------------------------ events

    def pending(self) -> int:
        """Bytes of events queued in the kernel, not read yet (one ioctl, no lock)."""
        fd = self._fd
        if fd == -1:
            return 0
        buf = bytearray(4)
        try:
            fcntl.ioctl(fd, termios.FIONREAD, buf)
        except OSError:
            return 0
        return int.from_bytes(buf, sys.byteorder)

    def queued(self, who: object) -> int:
        """Events `who` has to take (no lock: a glance); one more if it lost some."""
        return len(self._inboxes.get(who, ())) + (who in self._lost)

    def pump(self, *, limit: int | None = None, wait: bool = True) -> bool:
        """Read every event queued now and hand each to its listeners' inboxes. False,
        having read nothing, when more than `limit` bytes are queued or (not `wait`) another
        thread holds the lock: then the caller looks again from a worker thread."""
        if not self.lock.acquire(blocking=wait):
            return False
        try:
            size = self.pending()
            if limit is not None and size > limit:
                return False
            if size:
                try:
                    data = os.read(self._fd, size)
                except BlockingIOError:
                    return True
                self._dispatch(data)
            return True
        finally:
            self.lock.release()

    def _dispatch(self, data: bytes) -> None:
        pos = 0
        while pos + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, pos)
            name = os.fsdecode(data[pos + _EVENT.size:pos + _EVENT.size + length].rstrip(b"\0"))
            pos += _EVENT.size + length
            if mask & IN_Q_OVERFLOW:
                for who in self._inboxes:
                    self._lose(who)
            elif mask & IN_IGNORED:
                if self._retired.get(wd):
                    self._retired[wd] -= 1
                    if not self._retired[wd]:
                        del self._retired[wd]
                    continue  # answers our rm_watch: the wd was forgotten then
                for who in self._subscribers.pop(wd, {}):
                    self._inboxes.setdefault(who, []).append((wd, mask, name))  # lost or not
            else:
                for who, wanted in self._subscribers.get(wd, {}).items():
                    if not mask & wanted & IN_ALL_EVENTS or who in self._lost:
                        continue
                    inbox = self._inboxes.setdefault(who, [])
                    if len(inbox) >= INBOX_EVENTS:
                        self._lose(who)
                    else:
                        inbox.append((wd, mask, name))

    def _lose(self, who: object) -> None:
        # It walks its workspace again: only the ends of watches still matter to it.
        self._lost.add(who)
        self._inboxes[who] = [e for e in self._inboxes.get(who, ()) if e[1] & IN_IGNORED]

    def take(self, who: object) -> tuple[list[tuple[int, int, str]], bool]:
        """`who`'s events since it last took them (oldest first), and whether some were
        lost (then it must walk again)."""
        with self.lock:
            events = self._inboxes.get(who, [])
            if who in self._inboxes:
                self._inboxes[who] = []
            lost = who in self._lost
            self._lost.discard(who)
            return events, lost


_shared: Inotify | None = None
_shared_lock = threading.Lock()


def shared() -> Inotify:
    """The process's instance (made on first use; its descriptor on first subscribe)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Inotify()
        return _shared
