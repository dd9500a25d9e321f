"""What a session says about its memory limit: the OOM kills of its memory cgroup, read
before and after a call (a part of daemon/session.py's Session)."""

from __future__ import annotations


class MemoryNotes:
    """Mixed into Session, which has `sandbox` (its `cgroup` a SessionCgroups or None) and
    `limits`."""

    def oom_kills(self) -> int | None:
        """The session's count of processes ended by the kernel's OOM killer (None without a
        memory cgroup): take it before a call, and `memory_note` says afterwards whether
        the call met the memory limit."""
        cgroup = self.sandbox.cgroup
        return cgroup.oom_kills() if cgroup is not None else None

    def memory_limit_hit(self, oom_kills_before: int | None) -> bool:
        """Whether the OOM killer ended a process of the session since `oom_kills_before`
        was taken."""
        now = self.oom_kills()
        return oom_kills_before is not None and now is not None and now > oom_kills_before

    def memory_note(self, oom_kills_before: int | None) -> str:
        """A line saying that the session's memory limit was reached, if the OOM killer
        ended a process of the session since `oom_kills_before` was taken; else ""."""
        if not self.memory_limit_hit(oom_kills_before):
            return ""
        return (f"[the session's memory limit ({self.limits.memory_mb} MB) was reached: the "
                f"kernel's OOM killer ended a process of the session with SIGKILL while this "
                f"ran; use less memory, or open the session with a larger limits.memory_mb]")
