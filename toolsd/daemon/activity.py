"""Whether a session is idle, for `toolsd serve --idle-timeout`. Pure."""

from __future__ import annotations


class Activity:
    """What keeps a session from counting as idle (`toolsd serve --idle-timeout`): a call
    that names it, or one of its processes, in flight (a repl.exec included, with or without
    a task of its own), and a background process whose tree has not ended. Idle time counts
    from the end of the last of these (or from the session's opening). No I/O: the caller
    gives the time (trio.current_time)."""

    def __init__(self, now: float):
        self.busy = 0  # calls in flight and background trees alive
        self.since = now  # when the last of them ended

    def begin(self) -> None:
        self.busy += 1

    def end(self, now: float) -> None:
        self.busy -= 1
        self.since = max(self.since, now)

    def ran(self, now: float) -> None:
        """A call began and ended at `now`, with no wait between (nothing could see it
        busy): as begin() and end(now)."""
        self.since = max(self.since, now)

    def restart(self, now: float) -> None:
        """As if the session had just opened (a warm spare handed out)."""
        self.since = now

    def idle_for(self, now: float) -> float:
        return 0.0 if self.busy else max(0.0, now - self.since)
