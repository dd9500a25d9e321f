"""Session limits: file size, CPU time, and process count (a fork bomb). Memory: see
test_memory.py."""

from __future__ import annotations

import os

import pytest
from PIL import Image

from conftest import has_ended, needs_bwrap
from toolsd.client import ToolsdError
from toolsd.sandbox.launch import cgroups
pytestmark = pytest.mark.daemon(shared=True)


PLACES, WHY_NOT = cgroups.find_places()
needs_pids_cgroup = pytest.mark.skipif(
    "pids" not in PLACES, reason=f"no writable pids cgroup on this machine: {WHY_NOT.get('pids')}")


def test_file_size_limit(daemon, client):
    s = client.session_open(daemon.workspace, limits={"file_mb": 1})["session"]
    r = client.shell_run(s, "head -c 3000000 /dev/zero > big.bin; echo rc=$?; wc -c < big.bin")
    assert "rc=153" in r["output"]  # SIGXFSZ
    assert r["output"].strip().endswith("1048576")


def test_cpu_limit(daemon, client):
    s = client.session_open(daemon.workspace, limits={"cpu_s": 1})["session"]
    r = client.shell_run(s, "while :; do :; done", timeout_s=60)
    assert not r["timed_out"]
    assert r["signal"] in ("SIGKILL", "SIGXCPU")


@needs_bwrap
@needs_pids_cgroup
def test_fork_bomb_is_contained(daemon, client):
    s = client.session_open(daemon.workspace, limits={"pids": 40})["session"]
    # First make sure the limit is really there (RLIMIT_NPROC does not bind root: without the
    # cgroup this bomb would take the machine, not fail the test).
    launchers = daemon.running("driver/launcher.py")
    assert launchers
    for p in launchers:
        with open(f"/proc/{p.pid}/cgroup") as f:
            assert f"{cgroups.PREFIX}{daemon.proc.pid}/{s}" in f.read()
    r = client.shell_run(s, "bomb() { bomb | bomb & }; bomb; sleep 2", timeout_s=20)
    assert "Resource temporarily unavailable" in r["output"]
    # The daemon, the session and the machine are fine afterwards.
    assert client.shell_run(s, "echo alive")["output"] == "alive\n"
    assert client.hello()["protocol"] == 1
    client.session_close(s)
    assert [p for p in daemon.tree() if not has_ended(p)] == []


@needs_bwrap
@needs_pids_cgroup
def test_a_session_at_its_process_limit_says_so(daemon, client):
    s = client.session_open(daemon.workspace, limits={"pids": 12})["session"]
    started = []
    with pytest.raises(ToolsdError) as e:
        for _ in range(12):  # each needs a shim and a sleep: the limit comes first
            started.append(client.process_start(s, "exec sleep 1000"))
    assert e.value.code == "limit_exceeded"
    assert "limits.pids 12" in e.value.message
    with open(os.path.join(daemon.workspace, "pixel.png"), "wb") as f:
        Image.new("RGB", (1, 1)).save(f, "PNG")
    with pytest.raises(ToolsdError) as e:
        client.image_read(s, "pixel.png")  # its reader is a process too
    assert e.value.code == "limit_exceeded"
    for proc in started:
        client.process_stop(proc["id"])
    assert client.shell_run(s, "echo alive")["output"] == "alive\n"  # room again
    client.session_close(s)
