"""The state folder: what must survive a daemon restart.

Today that is the id counters (so `bg3` never names a different process after a restart) and
the background processes' log files.
"""

from __future__ import annotations

import fcntl
import os
import shutil


class StateInUse(Exception):
    pass


def ensure_private_dir(path: str) -> None:
    """Create `path` 0700 if missing. An existing folder is used as it is (never chmod'ed:
    `--socket /tmp/x.sock` must not close /tmp to everyone), but it must be ours."""
    try:
        os.makedirs(path, mode=0o700)
    except FileExistsError:
        pass
    st = os.stat(path)
    if st.st_uid != os.getuid():
        raise PermissionError(
            f"{path} belongs to uid {st.st_uid}, not to us; choose another --socket or --state-dir"
        )


# Counter values reserved per write: a write is an fsync, which costs a millisecond or more and
# would otherwise hold the event loop on every session.open and process.start.
ID_BLOCK = 32


class StateDir:
    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        ensure_private_dir(self.path)
        self._claim()
        self._lock_fd = self._lock()
        # Logs and scratch folders of a previous daemon (killed, so it could not clean up):
        # its processes died with it (--die-with-parent), and new ids never name them again.
        for folder in (self.logs, self.scratch, self.workspaces):
            shutil.rmtree(folder, ignore_errors=True)
            ensure_private_dir(folder)
        self._counters: dict[str, int] = {}  # the last value handed out
        self._reserved: dict[str, int] = {}  # the value on disk: values up to it are ours

    MARKER = ".toolsd-state"

    def _claim(self) -> None:
        """Only a folder toolsd made (or an empty one) is used: at start we clear its logs/
        and scratch/, which must never be someone's project folders."""
        marker = os.path.join(self.path, self.MARKER)
        if os.path.exists(marker):
            return
        if os.listdir(self.path):
            raise StateInUse(f"{self.path} is not empty and is not a toolsd state folder; "
                             f"give --state-dir an empty or new folder")
        with open(marker, "w") as f:
            f.write("toolsd state folder: id counters, logs, session scratch\n")

    def _lock(self) -> int:
        """One daemon per state folder: two sharing counters would hand out the same ids."""
        fd = os.open(os.path.join(self.path, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                     0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateInUse(f"the state folder {self.path} is in use by another toolsd; "
                             f"give this one its own --state-dir") from None
        return fd

    @property
    def logs(self) -> str:
        return os.path.join(self.path, "logs")

    @property
    def scratch(self) -> str:
        """Per-session /tmp folders live here (removed at session close)."""
        return os.path.join(self.path, "scratch")

    @property
    def workspaces(self) -> str:
        """The default work root: folders of sessions opened without a workspace."""
        return os.path.join(self.path, "workspaces")

    def next_id(self, name: str) -> int:
        """The next value of a counter that never goes back, even across restarts. Values are
        reserved ID_BLOCK at a time: the end of the block is on disk (fsync'd, renamed into
        place) before any value of it is told, so a daemon killed mid-block skips the rest of
        it and never repeats one. close() writes the last value back, so that after a clean
        stop numbering goes on without a gap."""
        current = self._counters.get(name)
        if current is None:
            current = self._reserved[name] = self._read(name)
        value = current + 1
        if value > self._reserved[name]:
            self._write(name, value + ID_BLOCK - 1)
            self._reserved[name] = value + ID_BLOCK - 1
        self._counters[name] = value
        return value

    def close(self) -> None:
        """At a clean stop: give back what was reserved and not used."""
        for name, value in self._counters.items():
            if self._reserved.get(name) != value:
                self._write(name, value)
                self._reserved[name] = value

    def _write(self, name: str, value: int) -> None:
        path = os.path.join(self.path, f"{name}.counter")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{value}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _read(self, name: str) -> int:
        try:
            with open(os.path.join(self.path, f"{name}.counter")) as f:
                return int(f.read().strip() or 0)
        except FileNotFoundError:
            return 0
        except ValueError:
            raise RuntimeError(
                f"the counter file {name}.counter in {self.path} is damaged; "
                f"put the highest id handed out in it, or remove the state folder"
            ) from None
