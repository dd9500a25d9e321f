"""What a tool may use of the session it runs in: the daemon's Session is one, and a test can
make its own around a launcher (tests/test_tool_alone.py). Tools name this, never the daemon.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Awaitable, Callable, Protocol

if TYPE_CHECKING:
    import trio

    from toolsd.sandbox.launch.file_helper_client import FileHelper
    from toolsd.sandbox.launch.job import Job
    from toolsd.sandbox.bwrap.policy import Limits
    from toolsd.sandbox.git_watch.repositories import RepositoryWatch
    from toolsd.sandbox.session_sandbox import Sandbox
    from toolsd.tools.background_process import BackgroundProcess
    from toolsd.tools.host import Host
    from toolsd.tools.repl_turns import ReplTurns
    from toolsd.tools.spill import Spills


class SessionView(Protocol):
    id: str
    host: Host
    workspace: str
    env: dict[str, str]  # the sandbox's environment, for what a tool starts itself
    limits: Limits
    home_is_own: bool  # the session has its own home (and $GIT_CONFIG_GLOBAL)
    sandbox: Sandbox  # what every command starts in: its launcher, shell, spawn
    nursery: trio.Nursery | None  # the session's tasks; None until it runs
    spills: Spills
    repositories: RepositoryWatch  # host_exec: every spawn waits for its baseline
    files: FileHelper
    python_exe: str | None  # the real python3 of the sandbox, once asked
    turns: ReplTurns  # repl.exec's REPLs, by turn

    @property
    def closed(self) -> bool: ...

    @property
    def processes(self) -> Mapping[str, BackgroundProcess]:
        """Its background processes by id, in start order."""

    def check_open(self) -> None:
        """ToolsdError (session_closed, saying why) unless the session can run calls."""

    def resolve_cwd(self, cwd: str | None) -> str: ...

    def command_env(self, extra: dict[str, str]) -> dict[str, str]: ...

    def oom_kills(self) -> int | None: ...

    def memory_limit_hit(self, oom_kills_before: int | None) -> bool: ...

    def memory_note(self, oom_kills_before: int | None) -> str: ...

    def start_soon(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        """Run `fn(*args)` as a task of the session: it ends when the session closes."""

    def keep_active(self, job: Job) -> None:
        """The session is not idle until `job`'s whole tree has ended."""

    def call(self) -> contextlib.AbstractContextManager[SessionView]:
        """Around a call on the session: it is not idle meanwhile."""

    def remember_python(self, path: str) -> None: ...

    async def reported(self, result):
        """`result` with what the session reports after each call (host_exec, egress)."""

    def reported_as(self, result, host_exec: list[str]):
        """`result` with `host_exec` as looked at (without a wait: repositories.look_now),
        and the rest of what `reported` adds."""
