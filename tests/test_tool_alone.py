"""A tool with no daemon: shell.run's tool function (tools/shell.py) run in a Sandbox
(sandbox/session_sandbox.py) the test makes itself around its own bubblewrap argv, given
the session through the SessionView Protocol (tools/session_view.py). `AloneSession` has
what shell.run and the spawn path under it use of a session; nothing of toolsd.daemon is
involved."""

from __future__ import annotations

import os

import psutil
import pytest
from _launchers import BWRAP, ENV, bwrap_prefix
from toolsd.sandbox.errors import Fault, SandboxError
from toolsd.sandbox.launch.spawning import open_devnull
from toolsd.sandbox.session_sandbox import Sandbox, SandboxSpec
from toolsd.sandbox.launch.spawn_request import SpawnRequest
from toolsd.sandbox.bwrap.policy import Limits
from toolsd.tools import shell
from toolsd.tools.spill import Spills
from toolsd.wire.protocol import ShellRunParams

pytestmark = pytest.mark.skipif(BWRAP is None, reason="bubblewrap (bwrap) is not installed")


class AloneSession:
    """The members of SessionView that shell.run reaches, over a sandbox of the test's."""

    def __init__(self, sandbox: Sandbox, workspace: str, scratch: str):
        self.id = "alone"
        self.sandbox = sandbox
        self.workspace = workspace
        self.limits = Limits()
        self.home_is_own = False
        self.spills = Spills(scratch, scratch, 1 << 20)

    def check_open(self) -> None:
        assert self.sandbox.alive()

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
    sandbox = Sandbox(SandboxSpec(name="alone", workspace=str(workspace), env=ENV,
                                  scratch=str(scratch), limits=Limits(),
                                  wrapper=tuple(bwrap_prefix(str(tmp_path)))))
    await sandbox.open(nursery)
    launcher = sandbox.launcher
    try:
        session = AloneSession(sandbox, str(workspace), str(scratch))
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
        await sandbox.aclose()
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                   for p in pids)


async def test_the_sandbox_says_what_failed_in_its_own_errors(nursery, tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    sandbox = Sandbox(SandboxSpec(name="alone", workspace=str(workspace), env=ENV,
                                  scratch=str(tmp_path / "scratch"), limits=Limits(),
                                  wrapper=tuple(bwrap_prefix(str(tmp_path)))))
    await sandbox.open(nursery)
    devnull = open_devnull()
    try:
        request = SpawnRequest(["no-such-program-xyz"], str(workspace), ENV, stdin=devnull,
                               stdout=devnull, stderr=devnull)
        with pytest.raises(SandboxError) as refused:
            await sandbox.spawn(request)
        assert refused.value.fault is Fault.REFUSED
        assert "could not start no-such-program-xyz" in refused.value.message
        await sandbox.aclose()
        assert not sandbox.alive(now=True) and not (tmp_path / "scratch").exists()
        with pytest.raises(SandboxError) as closed:
            await sandbox.spawn(request)
        assert closed.value.fault is Fault.CLOSED
        assert "open a new session" in closed.value.message
    finally:
        os.close(devnull)
        await sandbox.aclose()  # again: a no-op
