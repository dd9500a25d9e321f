"""Starting, refusing to double-start, replacing a stale socket, and stopping cleanly."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from conftest import RunningDaemon
from toolsd.client import Client, ConnectionLost


def test_sigterm_removes_the_socket_and_exits_0(daemon_root):
    d = RunningDaemon(daemon_root).start()
    with d.client() as c:
        assert c.hello()["protocol"] == 1
    assert d.stop() == 0
    assert not os.path.exists(d.socket)


def test_second_daemon_on_the_same_socket_refuses(daemon):
    second = subprocess.run(
        [sys.executable, "-m", "toolsd", "serve", "--socket", daemon.socket],
        capture_output=True, text=True, timeout=60, env=daemon.env)
    assert second.returncode != 0
    assert "already serving" in second.stderr
    with daemon.client() as c:  # the first one is untouched
        assert c.hello()["protocol"] == 1


def test_stale_socket_file_is_replaced(daemon_root):
    d = RunningDaemon(daemon_root)
    os.makedirs(os.path.dirname(d.socket), mode=0o700)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(d.socket)  # a socket file nobody listens on, as a killed daemon leaves
    stale.close()
    d.start()
    try:
        with d.client() as c:
            assert c.hello()["protocol"] == 1
    finally:
        assert d.stop() == 0


def test_client_without_daemon_says_how_to_start_one(daemon_root):
    with pytest.raises(ConnectionLost) as e:
        Client(os.path.join(daemon_root, "nothing.sock"))
    assert "toolsd serve" in e.value.message


def test_status_command_shows_sandbox_and_sessions(daemon, client):
    client.session_open(daemon.workspace)
    out = subprocess.run([sys.executable, "-m", "toolsd", "status", "--socket", daemon.socket],
                         capture_output=True, text=True, timeout=60, env=daemon.env)
    assert out.returncode == 0, out.stderr
    assert "sandbox:" in out.stdout
    assert "sessions: 1" in out.stdout
    assert daemon.workspace in out.stdout


def test_second_daemon_on_the_same_state_folder_refuses(daemon):
    other_socket = os.path.join(daemon.root, "other", "t.sock")
    second = subprocess.run(
        [sys.executable, "-m", "toolsd", "serve", "--socket", other_socket,
         "--state-dir", daemon.state_dir],
        capture_output=True, text=True, timeout=60, env=daemon.env)
    assert second.returncode != 0
    assert "in use by another toolsd" in second.stderr
    assert not os.path.exists(other_socket)
    with daemon.client() as c:
        assert c.hello()["protocol"] == 1


def serve(daemon_root, *args):
    return subprocess.run([sys.executable, "-m", "toolsd", "serve", *args],
                          capture_output=True, text=True, timeout=60)


def test_existing_socket_folder_keeps_its_mode(daemon_root):
    shared = os.path.join(daemon_root, "shared")
    os.makedirs(shared)
    os.chmod(shared, 0o755)
    d = RunningDaemon(daemon_root)
    d.socket = os.path.join(shared, "t.sock")
    d.start()
    try:
        assert os.stat(shared).st_mode & 0o777 == 0o755
        assert os.stat(d.socket).st_mode & 0o777 == 0o600
    finally:
        assert d.stop() == 0


def test_regular_file_at_the_socket_path_is_not_deleted(daemon_root):
    path = os.path.join(daemon_root, "precious.txt")
    with open(path, "w") as f:
        f.write("keep me\n")
    out = serve(daemon_root, "--socket", path, "--state-dir", os.path.join(daemon_root, "st"))
    assert out.returncode != 0 and "not a socket" in out.stderr
    with open(path) as f:
        assert f.read() == "keep me\n"


def test_state_dir_that_is_someones_folder_is_refused_untouched(daemon_root):
    project = os.path.join(daemon_root, "project")
    os.makedirs(os.path.join(project, "logs"))
    with open(os.path.join(project, "logs", "app.log"), "w") as f:
        f.write("important\n")
    out = serve(daemon_root, "--socket", os.path.join(daemon_root, "r", "t.sock"),
                "--state-dir", project)
    assert out.returncode != 0 and "not a toolsd state folder" in out.stderr
    assert os.path.exists(os.path.join(project, "logs", "app.log"))
