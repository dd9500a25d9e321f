"""What one spawn in a sandbox asks for, as a value: what the tools build, and what the
sandbox and its launcher take (the way Codex hands its exec layer an `ExecRequest`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["SpawnRequest"]


@dataclass(frozen=True, slots=True)
class SpawnRequest:
    """Start `argv` (argv[0] looked up on env's PATH) in folder `cwd`, with stdin, stdout,
    stderr and then extra_fds as its fds 0, 1, 2, 3, ... (the fds stay the caller's).
    `want_pid=False` leaves job.pid -1 (one wakeup less on the spawn's path); `held` keeps
    the shim the job's until job.let_go(); `tty` (cols, rows) makes fds 0-2 a new terminal
    instead. `rlimits` None: the sandbox's own. `resume_stopped`: the shim resumes the command
    (not the rest of its tree) whenever it stops, as a REPL's interpreter needs."""
    argv: Sequence[str]
    cwd: str
    env: Mapping[str, str]
    stdin: int
    stdout: int
    stderr: int
    extra_fds: Sequence[int] = ()
    want_pid: bool = True
    held: bool = False
    tty: tuple[int, int] | None = None
    rlimits: Mapping[str, tuple[int, int]] | None = None
    resume_stopped: bool = False
