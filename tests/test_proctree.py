"""Tree kill with real processes: the root is a launcher shim (a subreaper), as in toolsd,
in bwrap and unsandboxed."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap

import psutil
import pytest
import trio

from _launchers import PY, spawn_piped
from conftest import alive as running
from toolsd.sandbox.launch import proctree
async def start(launcher, argv):
    """Spawn with stdout on a pipe; returns (job, stream of its stdout)."""
    job, read_fd = await spawn_piped(launcher, argv)
    return job, trio.lowlevel.FdStream(read_fd)


async def read_until(stream, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        chunk = await stream.receive_some()
        assert chunk, f"EOF before {marker!r}: {data!r}"
        data += chunk
    return data


async def kill_tree(root: int, grace_s: float, include_root: bool = False):
    return await trio.to_thread.run_sync(
        lambda: proctree.kill_tree(root, grace_s=grace_s, include_root=include_root))


async def test_kill_tree_ends_a_shell_and_its_background_children(launcher):
    job, out = await start(launcher, ["bash", "-c", "sleep 1000 & echo started; sleep 1000"])
    async with out:
        await read_until(out, b"started\n")
        tree = [p.pid for p in proctree.descendants(job.shim_pid)]
        assert job.pid in tree and len(tree) >= 2, tree
        ended, survivors = await kill_tree(job.shim_pid, grace_s=2)
        assert (ended, survivors) == (len(tree), 0)
        assert running(tree) == []
        assert await job.wait() == (None, signal.SIGTERM)
        await job.done.wait()  # the shim saw its tree empty and left


SETSID_DOUBLE_FORK = textwrap.dedent("""
    import os, sys, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            print("grandchild ready", flush=True)
            time.sleep(1000)
        os._exit(0)
    os.wait()
""")


async def test_setsid_double_forked_grandchild_is_found_and_ended(launcher):
    job, out = await start(launcher, [PY, "-c", SETSID_DOUBLE_FORK])
    async with out:
        await read_until(out, b"grandchild ready\n")
        assert await job.wait() == (0, None)
        # The command and its child are gone; the grandchild left their session and its
        # parent died, yet it is still below the shim, which adopted it.
        tree = proctree.descendants(job.shim_pid)
        assert len(tree) == 1
        orphan = tree[0]
        assert orphan.ppid() == job.shim_pid
        assert orphan.cmdline()[:2] == [PY, "-c"]
        assert os.getsid(orphan.pid) != os.getsid(job.shim_pid)
        assert not job.done.is_set()
        assert await kill_tree(job.shim_pid, grace_s=2) == (1, 0)
        # The process itself, not its pid: under load a reaped pid may soon name another.
        assert not orphan.is_running() or orphan.status() == psutil.STATUS_ZOMBIE
        await job.done.wait()


async def test_process_ignoring_sigterm_is_sigkilled_after_grace(launcher):
    code = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\ntime.sleep(1000)")
    job, out = await start(launcher, [PY, "-c", code])
    async with out:
        await read_until(out, b"ready\n")
        assert await kill_tree(job.shim_pid, grace_s=0.3) == (1, 0)
        assert await job.wait() == (None, signal.SIGKILL)


async def test_grace_lets_a_sigterm_handler_finish(launcher):
    # os.write, not print: the signal may land while print('ready') is still inside the
    # buffered writer, and a print from the handler would then be a reentrant call.
    code = ("import os, signal, sys, time\n"
            "def bye(*_):\n    os.write(1, b'cleaned up\\n')\n    sys.exit(7)\n"
            "signal.signal(signal.SIGTERM, bye)\nos.write(1, b'ready\\n')\ntime.sleep(1000)")
    job, out = await start(launcher, [PY, "-c", code])
    async with out:
        await read_until(out, b"ready\n")
        assert await kill_tree(job.shim_pid, grace_s=5) == (1, 0)
        rest = b""
        while chunk := await out.receive_some():
            rest += chunk
        assert rest == b"cleaned up\n"
        assert await job.wait() == (7, None)


TREE_OF_200 = textwrap.dedent("""
    import os, signal
    r, w = os.pipe()
    for i in range(20):
        if os.fork() == 0:
            os.close(r)
            if i % 2:
                os.setsid()
            for j in range(9):
                if os.fork() == 0:
                    if j % 3 == 0:
                        os.setsid()
                    os.write(w, b"x")
                    while True:
                        signal.pause()
            os.write(w, b"x")
            while True:
                signal.pause()
    os.close(w)
    n = 0
    while n < 200:
        n += len(os.read(r, 200))
    print("ready", flush=True)
    while True:
        signal.pause()
""")


async def test_tree_of_200_with_setsid_members_leaves_no_survivor(launcher):
    job, out = await start(launcher, [PY, "-c", TREE_OF_200])
    async with out:
        await read_until(out, b"ready\n")
        tree = [p.pid for p in proctree.descendants(job.shim_pid)]
        assert len(tree) == 201
        ended, survivors = await kill_tree(job.shim_pid, grace_s=2)
        assert (ended, survivors) == (201, 0)
        assert running(tree) == []
        await job.done.wait()


async def test_a_kill_reads_its_own_tree_not_every_process_of_the_machine(launcher,
                                                                          monkeypatch):
    # A session's close kills its REPLs' trees: a kill that read every process's stat file
    # cost more for every session open, and closing them all grew as their square.
    if not proctree.HAVE_CHILDREN_FILES:
        pytest.skip("this kernel has no /proc/PID/task/TID/children files")

    def whole_proc():
        raise AssertionError("the kill read every process of the machine")

    monkeypatch.setattr(proctree, "_child_map", whole_proc)
    job, out = await start(launcher, [PY, "-c", TREE_OF_200])
    async with out:
        await read_until(out, b"ready\n")
        tree = [p.pid for p in proctree.descendants(job.shim_pid)]
        assert len(tree) == 201
        assert await kill_tree(job.shim_pid, grace_s=0) == (201, 0)
        assert running(tree) == []
        await job.done.wait()


def test_include_root_ends_the_root_and_its_children():
    root = subprocess.Popen([PY, "-c", "import subprocess, sys, time\n"
                             "subprocess.Popen(['sleep', '1000'])\n"
                             "print('ready', flush=True)\ntime.sleep(1000)"],
                            stdout=subprocess.PIPE)
    tree = [root.pid]
    try:
        assert root.stdout.readline() == b"ready\n"
        tree += [p.pid for p in proctree.descendants(root.pid)]
        assert len(tree) == 2
        assert proctree.kill_tree(root.pid, grace_s=1, include_root=True) == (2, 0)
        assert root.wait() == -signal.SIGTERM
        assert running(tree) == []
    finally:
        for pid in running(tree):
            os.kill(pid, signal.SIGKILL)
        root.wait()
        root.stdout.close()


def test_missing_root_is_an_empty_tree():
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert proctree.descendants(gone.pid) == []
    assert proctree.kill_tree(gone.pid, grace_s=0, include_root=False) == (0, 0)
    assert proctree.kill_tree(gone.pid, grace_s=0, include_root=True) == (0, 0)


def test_children_are_read_from_the_process_alone_and_match_the_whole_proc():
    # proctree.children reads the process's own task/*/children files (not all of /proc):
    # the same pids as psutil's scan of every process, threads' children included.
    code = ("import subprocess, sys, threading\n"
            "kids = [subprocess.Popen(['sleep', '1000']) for _ in range(3)]\n"
            "t = threading.Thread(\n"
            "    target=lambda: kids.append(subprocess.Popen(['sleep', '1000'])))\n"
            "t.start(); t.join()\n"
            "print('ready', flush=True); sys.stdin.read()\n")
    parent = subprocess.Popen(["python3", "-c", code], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    try:
        assert parent.stdout.readline() == b"ready\n"
        expected = sorted(p.pid for p in psutil.Process(parent.pid).children())
        assert len(expected) == 4
        assert sorted(proctree.children(parent.pid)) == expected
        assert proctree.children(2 ** 22 + 1) == []  # no such process
    finally:
        kids = psutil.Process(parent.pid).children()
        for kid in kids:
            kid.kill()
        parent.kill()
        parent.wait()
        psutil.wait_procs(kids, timeout=5)
        assert not any(k.is_running() and k.status() != psutil.STATUS_ZOMBIE for k in kids)
