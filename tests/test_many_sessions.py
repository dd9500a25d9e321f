"""Hundreds of sessions on one daemon, each with a REPL: the daemon then holds thousands of
descriptors, numbered far past select()'s 1024, and everything must go on working; the
sandboxed commands still get the session's own open files limit, not the daemon's."""

from __future__ import annotations

import os
import resource

import pytest
import trio

from conftest import needs_bwrap
from toolsd.client import AsyncClient

SESSIONS = 200
# Session opens and REPL starts in flight at once: enough to keep both cores busy.
CONCURRENCY = 4
# What the daemon is started with, as a login shell usually gives it (the hard limit of the
# machine stays as it is).
START_SOFT_LIMIT = 1024
SESSION_NOFILE = 1024  # sandbox.Limits.nofile

_soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
pytestmark = [needs_bwrap, pytest.mark.skipif(
    _hard != resource.RLIM_INFINITY and _hard < 4 * START_SOFT_LIMIT,
    reason=f"the hard open files limit ({_hard}) leaves no room for {SESSIONS} sessions"),
    # Started with a soft open files limit of 1024, as from a login shell.
    pytest.mark.daemon(shared=True, prefix=(
        "sh", "-c", f'ulimit -S -n {START_SOFT_LIMIT} && exec "$@"', "-"))]


def open_files_limit(pid: int) -> tuple[str, str]:
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return soft, hard
    raise AssertionError("no open files line in /proc/PID/limits")


def test_the_daemon_raises_its_open_files_limit_to_the_hard_limit(daemon):
    soft, hard = open_files_limit(daemon.proc.pid)
    assert soft == hard
    assert soft == "unlimited" or int(soft) > START_SOFT_LIMIT


def test_sandboxed_commands_keep_the_sessions_open_files_limit(daemon, client):
    s = client.session_open(daemon.workspace)["session"]
    expected = f"{SESSION_NOFILE}\n{SESSION_NOFILE}\n"
    assert client.shell_run(s, "ulimit -Sn; ulimit -Hn")["output"] == expected
    bg = client.process_start(s, "ulimit -Sn; ulimit -Hn")["id"]
    assert client.process_output(bg, wait_s=30, until=r"\d+\n\d+\n")["output"] == expected
    turn = client.turn_begin(s)["turn"]
    r = client.repl_exec(s, turn, "import resource; resource.getrlimit(resource.RLIMIT_NOFILE)")
    assert r["output"] == f"({SESSION_NOFILE}, {SESSION_NOFILE})\n"
    client.session_close(s)


async def test_hundreds_of_sessions_with_a_repl_each_all_run_shell_commands(daemon):
    workspaces = []
    for i in range(SESSIONS):
        workspaces.append(os.path.join(daemon.root, "many", f"ws{i}"))
        os.makedirs(workspaces[-1])
    sessions: list[tuple[str, str]] = []
    limiter = trio.CapacityLimiter(CONCURRENCY)
    async with await AsyncClient.connect(daemon.socket) as client:

        async def open_one(workspace: str) -> None:
            async with limiter:
                s = (await client.session_open(workspace))["session"]
                sessions.append((s, (await client.turn_begin(s))["turn"]))

        async def start_repl(s: str, turn: str) -> None:
            async with limiter:
                r = await client.repl_exec(s, turn, "x = 1")
                assert r["status"] == "ok", r

        async with trio.open_nursery() as nursery:
            for workspace in workspaces:
                nursery.start_soon(open_one, workspace)
        async with trio.open_nursery() as nursery:
            for s, turn in sessions:
                nursery.start_soon(start_repl, s, turn)
        # The premise: the daemon's descriptors now go past what select() can take, and the
        # sandboxes started last got their channels numbered there.
        assert len(os.listdir(f"/proc/{daemon.proc.pid}/fd")) > 1024
        failed = {}
        for s, _turn in sessions:
            try:
                r = await client.shell_run(s, "echo hi")
                if r["output"] != "hi\n":
                    failed[s] = r
            except Exception as e:
                failed[s] = repr(e)
        assert failed == {}
        assert len(sessions) == SESSIONS
        # Ending what a command left behind waits on pidfds, numbered past 1024 too.
        r = await client.shell_run(sessions[-1][0], "sleep 1000 & echo started")
        assert (r["output"], r["orphans_ended"]) == ("started\n", 1)
