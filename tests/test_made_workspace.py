"""Sessions without a host folder (protocol 1.2): session.open without `workspace` gets a
fresh, empty folder of the daemon's, which no other session sees, removed at close."""

from __future__ import annotations

import os

import pytest

from conftest import RunningDaemon
from toolsd.client import ToolsdError

pytestmark = pytest.mark.daemon(shared=True)


def test_a_session_without_a_workspace_gets_a_fresh_folder_removed_at_close(client, daemon):
    opened = client.session_open()
    session, workspace = opened["session"], opened["workspace"]
    assert os.path.isdir(workspace) and os.listdir(workspace) == []
    assert workspace.startswith(os.path.join(daemon.state_dir, "workspaces") + "/")
    r = client.shell_run(session, "pwd; echo made > here.txt; ls -A ..")
    lines = r["output"].splitlines()
    assert lines[0] == workspace
    assert lines[1:] == [os.path.basename(workspace)]  # the work root shows only its own
    with open(os.path.join(workspace, "here.txt")) as f:
        assert f.read() == "made\n"
    assert [s["workspace"] for s in client.session_list()["sessions"]
            if s["session"] == session] == [workspace]
    client.session_close(session)
    assert not os.path.exists(workspace)


def test_sessions_do_not_see_each_others_made_folders(client):
    a = client.session_open()
    b = client.session_open()
    client.shell_run(a["session"], "echo secret > mine.txt")
    r = client.shell_run(b["session"], f"cat {a['workspace']}/mine.txt; ls {a['workspace']}")
    assert r["exit_code"] != 0 and "secret" not in r["output"]
    # Nor can a session be opened on another's folder by its path.
    with pytest.raises(ToolsdError) as e:
        client.session_open(a["workspace"])
    assert e.value.code == "bad_params" and "toolsd's own folder" in e.value.message
    for s in (a, b):
        client.session_close(s["session"])
        assert not os.path.exists(s["workspace"])


def test_a_made_folder_is_removed_whatever_was_left_in_it(client):
    opened = client.session_open()
    client.shell_run(opened["session"], "mkdir -p a/b && touch a/b/f && chmod 000 a/b a && "
                                        "ln -s / root-link && mkfifo pipe")
    client.session_close(opened["session"])
    assert not os.path.exists(opened["workspace"])


def test_work_root_puts_them_elsewhere_and_hides_it(daemon_root):
    root = os.path.join(daemon_root, "work-root")
    d = RunningDaemon(daemon_root, extra_args=("--work-root", root)).start()
    try:
        with d.client() as c:
            host = c.session_open(d.workspace)["session"]
            made = c.session_open()
            assert os.path.dirname(made["workspace"]) == os.path.realpath(root)
            c.shell_run(made["session"], "echo x > inside.txt")
            # A session on a host folder does not see the work root's folders either.
            r = c.shell_run(host, f"ls -A {root}")
            assert os.path.basename(made["workspace"]) not in r["output"]
            c.session_close(made["session"])
            c.session_close(host)
            assert not os.path.exists(made["workspace"])
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_work_root_sessions_need_is_refused_at_start(daemon_root):
    d = RunningDaemon(daemon_root, extra_args=("--work-root", "/"))
    with pytest.raises(RuntimeError) as e:
        d.start()
    assert "every session would lose /" in str(e.value) and d.proc.returncode == 2
