"""A sandbox's hiding and protecting mounts, watched from the host: the kernel removes a mount
from every namespace when the host replaces the path under it, and a folder moved away on the
host takes its mounts along."""

from __future__ import annotations

import logging
import os
import select
from typing import Callable

import trio

from toolsd.sandbox.errors import Fault, SandboxError
from toolsd.sandbox.bwrap.policy import Policy, guarding_mounts, mount_points

log = logging.getLogger("toolsd.session")

# How often a session's hiding and protecting mounts are checked while its commands run (see
# Session.check_guards; every call that starts something checks too).
GUARD_CHECK_S = 0.5


def identities(paths, seen: dict | None = None) -> tuple[tuple[str, int | None, int | None],
                                                          ...]:
    """(path, st_dev, st_ino) of each path; None, None for one that is not there. `seen`:
    identities found a moment ago, by path, taken from and added to (GuardRounds: the homes
    and hidden folders every sandbox guards are looked at once a slice)."""
    ids = []
    for path in paths:
        found = seen.get(path) if seen is not None else None
        if found is None:
            try:
                st = os.stat(path)
                found = (path, st.st_dev, st.st_ino)
            except OSError:
                found = (path, None, None)
            if seen is not None:
                seen[path] = found
        ids.append(found)
    return tuple(ids)


def _read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)



class MountGuard:
    """The guarding mounts of one sandbox (policy.guarding_mounts) and how to tell that one is
    gone. Resource handling: owns the sandbox's /proc/PID/mountinfo descriptor from `open`
    to `close`."""

    def __init__(self, policy: Policy):
        self._policy = policy
        self._fd = -1  # the sandbox's /proc/PID/mountinfo (see check)
        self._poll = None
        self._dirs: list[str] = []  # guarding mount points that are folders
        self._ids: dict = {}  # path -> (st_dev, st_ino) as the sandbox started
        # The workspace was checked resolved (workspace_rules.py), and bwrap resolves its
        # path again when it mounts it: a folder on the way swapped for a symlink in between
        # (by another session, in its own workspace) would lead elsewhere, ~/.ssh say. Swapped
        # from here on, the mount lands at another path, which open() finds missing.
        if os.path.realpath(policy.workspace) != policy.workspace or \
                not os.path.isdir(policy.workspace):
            raise SandboxError(Fault.REFUSED, f"session.open: the workspace {policy.workspace} "
                               f"changed while the session opened (a folder on its way is now "
                               f"a symlink, or it is gone); open it again")

    @property
    def watching(self) -> bool:
        return self._fd != -1

    def note_folders(self) -> None:
        """The folders as the sandbox is about to bind them (see check)."""
        self._dirs = [p for p in guarding_mounts(self._policy) if os.path.isdir(p)]
        self._ids = {path: (dev, ino) for path, dev, ino in identities(self._dirs)}

    def open(self, host_pid: int) -> list[str]:
        """Start watching the mounts of the sandbox whose launcher is `host_pid`; the
        guarding mounts already gone (replaced as the sandbox started). OSError if its
        mountinfo cannot be read."""
        self._fd = os.open(f"/proc/{host_pid}/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
        # Made once: every call that starts something asks it.
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLPRI)
        return self._missing(_read_all(self._fd))

    def check(self, seen: dict | None = None) -> list[str]:
        """The guarded paths the host has replaced or moved since the sandbox started, if
        any. Cheap when nothing changed: the kernel flags the sandbox's mountinfo as soon as
        its mount table changes (POLLPRI), and only then is it read again. A folder moved
        away on the host takes its mounts along without changing the table: the guarded
        folders' identities are compared too (a stat each, or from `seen`: identities)."""
        if self._fd == -1:
            return []
        if self._poll.poll(0):
            missing = self._missing(_read_all(self._fd))  # reading re-arms the flag
            if missing:
                return missing
        return [path for path, dev, ino in identities(self._dirs, seen)
                if (dev, ino) != self._ids[path]]

    def _missing(self, mountinfo: bytes) -> list[str]:
        points = mount_points(mountinfo)
        return [p for p in guarding_mounts(self._policy) if p not in points]

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd != -1:
            os.close(fd)


# Guards a round checks between two checkpoints, so that a round over many sandboxes never
# holds the calls of the daemon for long.
ROUND_SLICE = 64


class GuardRounds:
    """Every watched sandbox's MountGuard, checked in one task (`run`) every GUARD_CHECK_S,
    for commands already running. One task a sandbox, each with its own timer, cost the
    daemon scheduler passes that grew with its sessions, idle or not, and slowed every call.

    Resource handling: `watch` opens a guard and keeps it in the round until its task is
    cancelled, then closes it; `run` is the owner's task (the daemon's, or a lone
    sandbox's)."""

    def __init__(self) -> None:
        self._watched: dict[MountGuard, Callable[[list[str]], None]] = {}

    async def run(self) -> None:
        while True:
            await trio.sleep(GUARD_CHECK_S)
            await self.check_all()

    async def check_all(self) -> None:
        """One round: `check(paths gone)` of every guard in it."""
        seen: dict = {}
        for n, (guard, check) in enumerate(list(self._watched.items()), 1):
            if guard.watching:
                check(guard.check(seen))
            if n % ROUND_SLICE == 0:
                await trio.sleep(0)
                seen = {}  # what the host did meanwhile is looked at again

    async def watch(self, guard: MountGuard, host_pid: int, name: str,
                    check: Callable[[list[str]], None], *,
                    task_status=trio.TASK_STATUS_IGNORED) -> None:
        """`guard.open`, then `check(paths gone)` now and at every round, until cancelled;
        `guard.close` at the end. Started (the mountinfo open and read) before the sandbox
        `name` is handed out."""
        try:
            missing = guard.open(host_pid)
        except OSError as e:
            log.warning("%s: cannot watch its mounts (%s)", name, e)
            task_status.started()
            return
        try:
            if missing:  # replaced as the sandbox started
                check(missing)
            self._watched[guard] = check
            task_status.started()
            await trio.sleep_forever()
        finally:
            self._watched.pop(guard, None)
            guard.close()
