"""Where bubblewrap cannot run: sessions say `sandbox: "none"`, never silently; the daemon can be
told to refuse instead; `toolsd doctor` says which and why."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import pytest

from conftest import HAVE_BWRAP, RunningDaemon
from toolsd.client import ToolsdError


def path_without_bwrap(root: str) -> str:
    """A PATH with the usual tools but no bwrap, as on a machine without bubblewrap."""
    bin_dir = os.path.join(root, "bin-no-bwrap")
    os.makedirs(bin_dir)
    for tool in ("bash", "sh", "python3", "cat", "echo", "sleep", "ls", "env", "head"):
        real = shutil.which(tool)
        if real:
            os.symlink(os.path.realpath(real), os.path.join(bin_dir, tool))
    return bin_dir


def toolsd(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolsd", *args], capture_output=True,
                          text=True, timeout=60, env=env)


def test_unsandboxed_sessions_say_so_and_still_clean_up(daemon_root):
    d = RunningDaemon(daemon_root)
    d.env["PATH"] = path_without_bwrap(daemon_root)
    d.start()
    try:
        with d.client() as c:
            assert c.hello()["sandbox"] == "none"
            opened = c.session_open(d.workspace)
            assert opened["sandbox"] == "none"
            s = opened["session"]
            assert c.shell_run(s, "echo hi")["output"] == "hi\n"
            r = c.shell_run(s, "sleep 1000 & echo started")
            assert r["orphans_ended"] == 1
            c.process_start(s, "sleep 1000")
            with pytest.raises(ToolsdError) as e:
                c.session_open(d.workspace, writable=False)
            assert e.value.code == "sandbox_unavailable"
        assert "UNSANDBOXED" in d.read_log()
    finally:
        assert d.stop() == 0  # and stop() checks that nothing of it is left


def test_require_sandbox_refuses_to_start(daemon_root):
    env = dict(os.environ, PATH=path_without_bwrap(daemon_root), HOME=daemon_root)
    sock = os.path.join(daemon_root, "run", "t.sock")
    out = toolsd("serve", "--socket", sock, "--require-sandbox", env=env)
    assert out.returncode != 0
    assert "--require-sandbox" in out.stderr and "bubblewrap" in out.stderr
    assert not os.path.exists(sock)


def test_doctor_says_why_without_bwrap(daemon_root):
    env = dict(os.environ, PATH=path_without_bwrap(daemon_root))
    out = toolsd("doctor", env=env)
    assert out.returncode == 1
    assert "sandbox: none: sessions would run UNSANDBOXED" in out.stdout
    assert "bwrap:             NO  bubblewrap (bwrap) is not installed" in out.stdout


@pytest.mark.skipif(not HAVE_BWRAP, reason="bubblewrap (bwrap) is not installed")
def test_doctor_with_bwrap():
    out = toolsd("doctor", env=dict(os.environ))
    assert out.returncode == 0
    assert out.stdout.splitlines()[-1].startswith("sandbox: bwrap")


def test_an_unsandboxed_session_forwards_a_port_too(daemon_root):
    # The launcher then runs in the host's network namespace: the same connect, the same
    # relay, and it is loaded from the same place.
    d = RunningDaemon(daemon_root)
    d.env["PATH"] = path_without_bwrap(daemon_root)
    d.start()
    try:
        with d.client() as c:
            s = c.session_open(d.workspace)["session"]
            with socket.socket() as server:
                server.bind(("127.0.0.1", 0))
                server.listen()
                forward = c.port_forward(s, server.getsockname()[1])
                with socket.create_connection((forward["host"], forward["port"]),
                                              timeout=30) as conn:
                    inside, _ = server.accept()
                    with inside:
                        conn.sendall(b"through")
                        assert inside.recv(7) == b"through"
            c.session_close(s)
    finally:
        assert d.stop() == 0, d.read_log()
