"""One session's watch of its workspace's repositories (hostexec.Tracker): the baseline when
it starts, and after each call what the session added that the host's git would execute
(`host_exec` in every result)."""

from __future__ import annotations

import logging

import trio

from toolsd.sandbox.git_watch import hostexec
log = logging.getLogger("toolsd.session")


class RepositoryWatch:
    """Resource handling: owns the Tracker (none for a read-only workspace, where the session
    can add nothing); `aclose()` closes it. `known` is set once the baseline is taken:
    commands may start (Sandbox.spawn waits for it)."""

    def __init__(self, workspace: str, writable: bool, session_id: str):
        self.tracker = hostexec.Tracker(workspace) if writable else None
        self.session_id = session_id  # for the log; a warm spare's changes when handed out
        self._lock = trio.Lock()
        self.known = trio.Event()

    async def start(self) -> None:
        """Take the baseline (in a worker thread), then set `known`."""
        try:
            if self.tracker is not None:
                await trio.to_thread.run_sync(self.tracker.start)
        except Exception:
            # Only a report is lost: the session itself goes on.
            log.exception("session %s: the workspace's repositories are not watched",
                          self.session_id)
        finally:
            self.known.set()

    async def rebaseline(self) -> None:
        """What the workspace holds now is what the session found (a sandbox made ahead,
        handed to a session: what changed meanwhile is not this session's doing)."""
        tracker = self.tracker
        # Else the baseline is as it was.
        if tracker is not None and tracker.changed() and not tracker.baseline_holds():
            async with self._lock:
                await trio.to_thread.run_sync(tracker.rebaseline)

    async def look(self) -> list[str]:
        """What the session added that the host's git would execute (hostexec.Tracker): for
        every call's result, looked at when the call is over. One poll when nothing in the
        workspace's folders changed."""
        tracker = self.tracker
        if tracker is None:
            return []
        if tracker.changed() and tracker.update_now() is None:
            async with self._lock:
                try:
                    await trio.to_thread.run_sync(tracker.update)
                except Exception:
                    # The call's own result stands; the list stays as last looked at.
                    log.exception("session %s: could not look at its repositories",
                                  self.session_id)
        return list(tracker.found)

    def look_now(self) -> list[str] | None:
        """look() without waiting: None when the workspace changed and looking at it
        needs a worker thread (then call look)."""
        tracker = self.tracker
        if tracker is None:
            return []
        if tracker.changed() and tracker.update_now() is None:
            return None
        return list(tracker.found)

    def last_seen(self) -> list[str]:
        """As of the last look, without looking (session.list)."""
        tracker = self.tracker
        return [] if tracker is None else list(tracker.found)

    async def aclose(self) -> None:
        if self.tracker is not None:
            # One syscall per watch released (a big workspace has thousands): not on the
            # event loop.
            await trio.to_thread.run_sync(self.tracker.close)
