"""The state folder: what must survive a daemon restart.

Today that is the id counters (so `bg3` never names a different process after a restart) and
the background processes' log files.
"""

from __future__ import annotations

import os

from .paths import ensure_private_dir


class StateDir:
    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        ensure_private_dir(self.path)
        ensure_private_dir(self.logs)
        ensure_private_dir(self.scratch)
        self._counters: dict[str, int] = {}

    @property
    def logs(self) -> str:
        return os.path.join(self.path, "logs")

    @property
    def scratch(self) -> str:
        """Per-session /tmp folders live here (removed at session close)."""
        return os.path.join(self.path, "scratch")

    def next_id(self, name: str) -> int:
        """The next value of a counter that never goes back, even across restarts: the new value
        is on disk (fsync'd, renamed into place) before anyone is told it."""
        current = self._counters.get(name)
        if current is None:
            current = self._read(name)
        value = current + 1
        path = os.path.join(self.path, f"{name}.counter")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{value}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self._counters[name] = value
        return value

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
