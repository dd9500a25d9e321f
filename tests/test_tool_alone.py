"""A tool with no daemon: shell.run's tool function (tools/shell.py) run on a launcher in a
bubblewrap sandbox the test makes itself, given the session through the SessionView
Protocol (tools/session_view.py). `AloneSession` has what shell.run and the spawn path
under it use of a session; nothing of toolsd.daemon is involved."""

from __future__ import annotations

import os

import psutil
import pytest
import trio

from _launchers import BWRAP, ENV, bwrap_prefix
from toolsd.sandbox.launcher import Launcher
from toolsd.sandbox.policy import Limits
from toolsd.tools import shell
from toolsd.tools.spill import Spills
from toolsd.wire.protocol import ShellRunParams

pytestmark = pytest.mark.skipif(BWRAP is None, reason="bubblewrap (bwrap) is not installed")


class _Known:
    """repositories: the workspace's repositories were looked at already (there are none)."""

    def __init__(self):
        self.known = trio.Event()
        self.known.set()


class AloneSession:
    """The members of SessionView that shell.run reaches, over a launcher of the test's."""

    def __init__(self, launcher: Launcher, workspace: str, scratch: str):
        self.id = "alone"
        self.launcher = launcher
        self.workspace = workspace
        self.limits = Limits()
        self.rlimits: dict[str, int] = {}
        self.home_is_own = False
        self.spills = Spills(scratch, scratch, 1 << 20)
        self.repositories = _Known()

    @property
    def shell(self) -> tuple[str, str]:
        ready = self.launcher.ready
        return ("bash", ready.bash) if ready.bash else ("sh", ready.sh)

    def check_open(self) -> None:
        assert self.launcher.alive

    def resolve_cwd(self, cwd: str | None) -> str:
        return os.path.join(self.workspace, cwd or "")

    def command_env(self, extra: dict[str, str]) -> dict[str, str]:
        return {**ENV, **extra}

    def oom_kills(self) -> int | None:
        return None

    def memory_note(self, oom_kills_before: int | None) -> str:
        return ""


class Answer:
    """tools.calls.Answer without a connection: what runs after the answer, run by the test."""

    def __init__(self):
        self.afters = []
        self.events: list[str] = []

    def after(self, fn) -> None:
        self.afters.append(fn)

    async def emit(self, data: str) -> None:
        self.events.append(data)

    def answered(self) -> None:
        for fn in self.afters:
            fn()


async def run(session: AloneSession, command: str, **params):
    answer = Answer()
    try:
        return await shell.run(session, ShellRunParams(session.id, command, **params), answer)
    finally:
        answer.answered()


async def test_shell_run_without_a_daemon(nursery, tmp_path):
    workspace, scratch = tmp_path / "ws", tmp_path / "scratch"
    workspace.mkdir()
    scratch.mkdir()
    launcher = await Launcher.start(nursery, wrapper=bwrap_prefix(str(tmp_path)), env=ENV)
    try:
        session = AloneSession(launcher, str(workspace), str(scratch))
        r = await run(session, "echo $((6*7)); pwd; echo to-stderr >&2; touch made; exit 3")
        assert (r.exit_code, r.timed_out, r.shell) == (3, False, "bash")
        assert r.output == f"42\n{workspace}\nto-stderr\n"
        assert (workspace / "made").exists()  # the sandbox's bind of the workspace
        # In the sandbox: its own pid namespace, with the launcher as pid 1.
        r = await run(session, "echo $$; cat /proc/1/cmdline | tr '\\0' ' '")
        shell_pid, init = r.output.split("\n", 1)
        assert int(shell_pid) < 100 and "launcher" in init, r.output
        # What it leaves running is ended, and counted.
        r = await run(session, "sleep 3217 & echo started")
        assert (r.output, r.orphans_ended) == ("started\n", 1)
        # A command past its timeout is killed; the tool says so.
        r = await run(session, "echo begun; sleep 3217", timeout_s=0.5)
        assert r.timed_out and r.output == "begun\n"
        pids = {launcher.wrapper_pid, launcher.host_pid}
        sleepers = [p for p in psutil.process_iter(["cmdline"])
                    if p.info["cmdline"] == ["sleep", "3217"]]
        assert sleepers == []
    finally:
        await launcher.aclose()
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                   for p in pids)
