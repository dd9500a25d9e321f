"""A cgroup per session, where the machine lets us make one: `pids` and `memory`.

Why pids: RLIMIT_NPROC does not bind uid 0 (the kernel exempts the host's root user), and
toolsd often runs as root, so without it a fork bomb in a session takes the whole machine.
Why memory: the only other memory limit, RLIMIT_AS, caps address space rather than memory,
and runtimes that reserve large ranges and touch little of them fail under it (WebAssembly
in node reserves some 10 GB for one page, Go, the JVM, sanitizers). A memory cgroup limits
what the whole session really uses (resident memory and page cache, swap too), and the
kernel's OOM killer ends the process that takes the session over it. Nothing inside can
leave or raise either (the sandbox has no write access to /sys/fs/cgroup).

Where a controller cannot be used, sessions run without it and the daemon logs why: the
session then falls back to RLIMIT_NPROC (pids) and RLIMIT_AS (memory).

Where the folders go:
- cgroup v1 (one hierarchy per controller, /sys/fs/cgroup/<controller>): below the daemon's
  own cgroup of that hierarchy (from /proc/self/cgroup), as
  `<own>/toolsd-<daemon pid>/<session>`, so whatever limits the daemon (a service's or a
  container's cgroup) also limits its sessions.
- cgroup v2 (one hierarchy at /sys/fs/cgroup): below its root, where processes may live
  beside child cgroups with controllers (v2 refuses that to any other cgroup that has
  processes, the daemon's own included), with the controllers delegated on the way down.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import re

log = logging.getLogger("toolsd.cgroups")

V1_BASE = "/sys/fs/cgroup"  # v1 hierarchies are mounted at V1_BASE/<controller>
V2_ROOT = "/sys/fs/cgroup"
PREFIX = "toolsd-"
CONTROLLERS = ("pids", "memory")


@dataclasses.dataclass(frozen=True)
class Place:
    """Where this daemon makes one controller's cgroups: `folder` holds its toolsd-PID/."""

    controller: str
    folder: str
    version: int  # 1 or 2


# ---------------------------------------------------------------- pure parts


def own_v1_path(proc_self_cgroup: str, controller: str) -> str | None:
    """The path of our cgroup in the v1 hierarchy of `controller`, from the text of
    /proc/self/cgroup (lines `ID:CONTROLLERS:PATH`); None if no hierarchy has it."""
    for line in proc_self_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[0] != "0" and controller in parts[1].split(","):
            return parts[2]
    return None


def limit_files(place: Place, *, pids: int, memory_mb: int) -> list[tuple[str, str]]:
    """(file, value) to write in a session's folder for `place`'s controller, in order. Swap
    counts against memory_mb too (v1: memory+swap equal to memory; v2: no swap of its own), so
    memory_mb is what the session may hold, wherever the kernel keeps it. A file that may be
    missing (no swap accounting) is the caller's to skip: see OPTIONAL_FILES."""
    if place.controller == "pids":
        return [("pids.max", str(pids))]
    limit = str(memory_mb * 1024 * 1024)
    if place.version == 1:
        # memsw may never be below the memory limit: the memory limit goes first.
        return [("memory.limit_in_bytes", limit), ("memory.memsw.limit_in_bytes", limit)]
    return [("memory.max", limit), ("memory.swap.max", "0")]


OPTIONAL_FILES = ("memory.memsw.limit_in_bytes", "memory.swap.max")


def oom_kill_count(text: str) -> int | None:
    """The `oom_kill N` line of a v1 memory.oom_control or a v2 memory.events text (kernels
    from 4.13 have it); None without one."""
    found = _OOM_KILL_LINE.search(text)
    return int(found[1]) if found else None


# One search rather than a split of every line: it is read before and after every call.
_OOM_KILL_LINE = re.compile(r"^oom_kill[ \t]+(\d+)[ \t]*$", re.MULTILINE | re.ASCII)


def join_argv(folders: list[str]) -> list[str]:
    """A prefix that moves itself into every folder's cgroup, then execs the rest: every
    process the sandbox ever has descends from it, so none is born outside the limits."""
    script = ('while [ "$1" != -- ]; do echo $$ > "$1/cgroup.procs" || exit 125; shift; done; '
              'shift; exec "$@"')
    return ["/bin/sh", "-c", script, "toolsd-cgroup", *folders, "--"]


# ---------------------------------------------------------------- finding where


def find_places() -> tuple[dict[str, Place], dict[str, str]]:
    """({controller: Place} for those we may use, {controller: why not} for the others)."""
    places: dict[str, Place] = {}
    why: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup") as f:
            own = f.read()
    except OSError:
        own = ""
    v2_controllers = _read(os.path.join(V2_ROOT, "cgroup.controllers"))
    for controller in CONTROLLERS:
        mount = os.path.join(V1_BASE, controller)
        path = own_v1_path(own, controller)
        if os.path.isfile(os.path.join(mount, "cgroup.procs")) and path is not None:
            folder = os.path.normpath(mount + "/" + path)
            if os.path.isfile(os.path.join(folder, "cgroup.procs")) and os.access(folder,
                                                                                  os.W_OK):
                places[controller] = Place(controller, folder, 1)
            else:
                why[controller] = f"the daemon's cgroup {folder} is not writable"
        elif v2_controllers is not None and controller in v2_controllers.split():
            if os.access(V2_ROOT, os.W_OK):
                places[controller] = Place(controller, V2_ROOT, 2)
            else:
                why[controller] = f"the cgroup v2 root {V2_ROOT} is not writable"
        else:
            why[controller] = (f"no cgroup v1 {controller} hierarchy and no cgroup v2 root "
                               f"with the {controller} controller")
    return places, why


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


# ---------------------------------------------------------------- a session's cgroups


class SessionCgroups:
    """One session's cgroup folders (one per hierarchy: v1 has one per controller, v2 one
    for both) and the controllers limited there.

    Resource handling: `create` makes the folders; `remove` deletes them once empty (the
    session's processes are gone by then), after closing the OOM count's descriptor that
    `oom_kills` keeps open. Leftovers of a killed daemon are removed by `remove_stale` at
    the next start."""

    def __init__(self, folders: dict[str, str], oom_file: str | None = None):
        self.folders = folders  # controller -> the session's folder that limits it
        self._oom_file = oom_file  # where the memory controller counts its OOM kills
        self._oom_fd = -1  # _oom_file, opened on the first count

    @classmethod
    def create(cls, places: dict[str, Place], name: str, *, pids: int,
               memory_mb: int) -> SessionCgroups:
        """The controllers that cannot be set up are left out, each logged; the session
        falls back to an rlimit for them."""
        folders: dict[str, str] = {}
        oom_file = None
        for controller, place in places.items():
            daemon_folder = os.path.join(place.folder, f"{PREFIX}{os.getpid()}")
            path = os.path.join(daemon_folder, name)
            made = path not in folders.values()
            try:
                os.makedirs(daemon_folder, exist_ok=True)
                if place.version == 2:
                    _enable_v2(place.folder, daemon_folder, controller)
                os.makedirs(path, exist_ok=True)
                for file, value in limit_files(place, pids=pids, memory_mb=memory_mb):
                    try:
                        with open(os.path.join(path, file), "w") as f:
                            f.write(value)
                    except FileNotFoundError:
                        if file not in OPTIONAL_FILES:
                            raise
            except OSError as e:
                log.warning("session %s: no %s cgroup (%s)", name, controller, e)
                if made:
                    _rmdir(path)
                continue
            folders[controller] = path
            if controller == "memory":
                oom_file = os.path.join(
                    path, "memory.oom_control" if place.version == 1 else "memory.events")
        return cls(folders, oom_file)

    def limits(self, controller: str) -> bool:
        return controller in self.folders

    def join_argv(self) -> list[str]:
        return join_argv(sorted(set(self.folders.values()))) if self.folders else []

    def oom_kills(self) -> int | None:
        """How many processes of the session the kernel's OOM killer has ended so far
        (None without a memory cgroup, or on a kernel that does not count them). Asked
        before and after every call: one pread of a descriptor kept open, as the kernel
        writes a cgroup file's text afresh for each read from offset 0."""
        if self._oom_file is None:
            return None
        try:
            if self._oom_fd == -1:
                self._oom_fd = os.open(self._oom_file, os.O_RDONLY | os.O_CLOEXEC)
            text = os.pread(self._oom_fd, 4096, 0)
        except OSError:
            return None
        return oom_kill_count(text.decode("ascii", "replace"))

    def remove(self) -> None:
        self._oom_file = None  # counted no more: the folder goes
        fd, self._oom_fd = self._oom_fd, -1
        if fd != -1:
            os.close(fd)
        for path in set(self.folders.values()):
            _rmdir(path)
            _rmdir(os.path.dirname(path))  # the daemon's folder, once its last session is gone


def _enable_v2(root: str, folder: str, controller: str) -> None:
    # cgroup v2 only gives a child a controller's files once its parent delegates it.
    for parent in (root, folder):
        try:
            with open(os.path.join(parent, "cgroup.subtree_control"), "w") as f:
                f.write(f"+{controller}")
        except OSError:
            pass


def _rmdir(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError as e:
        if e.errno not in (errno.ENOENT, errno.EBUSY, errno.ENOTEMPTY):
            raise


def remove_stale(folder: str) -> None:
    """Remove the cgroup folders of daemons that are no longer running."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if not name.startswith(PREFIX) or not name[len(PREFIX):].isdigit():
            continue
        pid = int(name[len(PREFIX):])
        if pid != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            stale = os.path.join(folder, name)
            for child in os.listdir(stale) if os.path.isdir(stale) else []:
                if os.path.isdir(os.path.join(stale, child)):
                    _rmdir(os.path.join(stale, child))
            _rmdir(stale)
