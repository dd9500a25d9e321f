"""A pids cgroup per session, where the machine lets us make one.

Why: RLIMIT_NPROC does not bind uid 0 (the kernel exempts the host's root user), and toolsd
often runs as root, so without this a fork bomb in a session takes the whole machine. A pids
cgroup limits the session's tasks whoever they run as, and nothing inside can leave it
(the sandbox has no write access to /sys/fs/cgroup).

Where no pids controller can be used (no cgroup v1 pids hierarchy and no cgroup v2 root with
the pids controller we may write to), sessions run without it and the daemon logs why.
"""

from __future__ import annotations

import errno
import os

V1_ROOT = "/sys/fs/cgroup/pids"
V2_ROOT = "/sys/fs/cgroup"
PREFIX = "toolsd-"


def find_root() -> tuple[str | None, str]:
    """(a folder under which we may create pids cgroups, or None; why not)."""
    if os.path.isfile(os.path.join(V1_ROOT, "cgroup.procs")) and os.access(V1_ROOT, os.W_OK):
        return V1_ROOT, ""
    controllers = os.path.join(V2_ROOT, "cgroup.controllers")
    try:
        with open(controllers) as f:
            if "pids" in f.read().split() and os.access(V2_ROOT, os.W_OK):
                return V2_ROOT, ""
    except OSError:
        pass
    return None, "no writable pids cgroup (cgroup v1 pids, or cgroup v2 root with pids)"


def _enable_v2_pids(root: str, folder: str) -> None:
    # cgroup v2 only gives a child a pids.max once its parent delegates the controller.
    for parent in (root, folder):
        try:
            with open(os.path.join(parent, "cgroup.subtree_control"), "w") as f:
                f.write("+pids")
        except OSError:
            pass


class PidsCgroup:
    """Resource handling: `create` makes the folder; `remove` deletes it once empty (the
    session's processes are gone by then). Leftovers of a killed daemon are removed by
    `remove_stale` at the next start."""

    def __init__(self, path: str):
        self.path = path

    @classmethod
    def create(cls, root: str, name: str, limit: int) -> PidsCgroup:
        daemon_folder = os.path.join(root, f"{PREFIX}{os.getpid()}")
        os.makedirs(daemon_folder, exist_ok=True)
        if root == V2_ROOT:
            _enable_v2_pids(root, daemon_folder)
        path = os.path.join(daemon_folder, name)
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "pids.max"), "w") as f:
            f.write(str(limit))
        return cls(path)

    def join_argv(self) -> list[str]:
        """A prefix that moves itself into the cgroup, then execs the rest: every process the
        sandbox ever has descends from it, so none is born outside the limit."""
        return ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', self.path]

    def current(self) -> int:
        with open(os.path.join(self.path, "pids.current")) as f:
            return int(f.read())

    def remove(self) -> None:
        _rmdir(self.path)
        _rmdir(os.path.dirname(self.path))  # the daemon's folder, once its last session is gone


def _rmdir(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError as e:
        if e.errno not in (errno.ENOENT, errno.EBUSY, errno.ENOTEMPTY):
            raise


def remove_stale(root: str) -> None:
    """Remove the cgroup folders of daemons that are no longer running."""
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        if not name.startswith(PREFIX) or not name[len(PREFIX):].isdigit():
            continue
        pid = int(name[len(PREFIX):])
        if pid != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            folder = os.path.join(root, name)
            for child in os.listdir(folder) if os.path.isdir(folder) else []:
                if os.path.isdir(os.path.join(folder, child)):
                    _rmdir(os.path.join(folder, child))
            _rmdir(folder)

