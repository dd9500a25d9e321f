"""Which folders a session may work in: a hidden path (an entry the homes hide, a --hide path,
the daemon's own folders) is refused as a workspace, and so is a folder inside one, however
it is named; a workspace that holds hidden paths is served with them hidden; /tmp and a
folder that holds the daemon's state are served, the daemon's folders hidden in them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from conftest import RunningDaemon, needs_bwrap, short_tempdir
from toolsd.client import ToolsdError
from toolsd.sandbox import home as home_module
from toolsd.sandbox import workspace_rules

pytestmark = needs_bwrap

ENTRIES = (*home_module.SECRETS, *home_module.OWN)


def write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


@pytest.fixture(scope="module")
def daemon():
    """A daemon whose (fake) HOME holds every hidden entry as a folder with a token in it,
    except ~/.kube, a symlink to dotfiles/kube; and a --hide folder."""
    root = short_tempdir()
    d = RunningDaemon(root, extra_args=("--hide", os.path.join(root, "vault")))
    for i, entry in enumerate(ENTRIES):
        if entry != ".kube":
            write(os.path.join(d.home, entry, "token"), f"HIDDEN-TOKEN-{i}\n")
    write(os.path.join(d.home, "dotfiles", "kube", "config"), "HIDDEN-TOKEN-KUBE\n")
    os.symlink("dotfiles/kube", os.path.join(d.home, ".kube"))
    os.makedirs(os.path.join(d.home, "proj"))
    write(os.path.join(root, "vault", "key"), "HIDDEN-TOKEN-VAULT\n")
    d.start()
    try:
        yield d
        assert d.stop() == 0, d.read_log()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def client(daemon):
    with daemon.client() as c:
        yield c


def refusal(client, workspace: str) -> str:
    with pytest.raises(ToolsdError) as e:
        client.session_open(workspace)
    assert e.value.code == "bad_params", e.value
    return e.value.message


@pytest.mark.parametrize("entry", ENTRIES)
def test_every_hidden_entry_of_the_home_is_refused_as_a_workspace(daemon, client, entry):
    path = os.path.join(daemon.home, entry)
    why = refusal(client, path)
    assert f"is ~/{entry}, which toolsd hides from every session" in why, why
    assert "open the session on a project folder elsewhere" in why
    inner = os.path.join(path, "sub")
    os.makedirs(inner, exist_ok=True)
    assert f"lies inside ~/{entry}" in refusal(client, inner)
    # Named through a symlink, or with `..` on the way: the same folder, the same rule.
    link = os.path.join(daemon.root, "links", entry.replace("/", "-"))
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if not os.path.lexists(link):
        os.symlink(path, link)
    assert f"is ~/{entry}, which" in refusal(client, link)
    assert f"lies inside ~/{entry}" in refusal(client, os.path.join(link, "sub"))
    dotdot = os.path.join(daemon.home, "proj", "..", entry, "sub", "..")
    assert f"is ~/{entry}, which" in refusal(client, dotdot)


def test_a_hidden_entry_named_through_a_symlink_or_dotdot_is_refused(daemon, client):
    link = os.path.join(daemon.root, "keys-link")
    os.symlink(os.path.join(daemon.home, ".ssh"), link)
    assert "is ~/.ssh," in refusal(client, link)
    assert "lies inside ~/.ssh," in refusal(client, os.path.join(link, "sub"))
    assert "is ~/.ssh," in refusal(client, os.path.join(daemon.home, "proj", "..", ".ssh"))
    assert "is ~/.aws," in refusal(client, os.path.join(daemon.home, ".ssh", "..", ".aws"))
    # A hidden entry that is a symlink hides where it leads.
    assert "is ~/.kube," in refusal(client, os.path.join(daemon.home, "dotfiles", "kube"))


def test_the_daemons_own_folders_and_hide_paths_are_refused(daemon, client):
    state_scratch = os.path.join(daemon.state_dir, "scratch")
    for path, what in [(os.path.dirname(daemon.socket), "toolsd's socket folder"),
                       (daemon.state_dir, "toolsd's state folder"),
                       (state_scratch, "toolsd's state folder"),
                       (os.path.join(daemon.root, "vault"), "hidden by toolsd serve --hide")]:
        why = refusal(client, path)
        assert f"({what})" in why and "toolsd's own folders" in why, why


def test_a_workspace_that_holds_hidden_entries_shows_them_hidden(daemon, client):
    for ws in (os.path.join(daemon.home, ".config"), os.path.join(daemon.home, ".local")):
        s = client.session_open(ws)["session"]
        r = client.shell_run(s, "grep -r HIDDEN-TOKEN . ; echo made > made.txt; echo rc=$?")
        client.session_close(s)
        assert "HIDDEN-TOKEN" not in r["output"] and r["output"].endswith("rc=0\n"), r
        with open(os.path.join(ws, "made.txt")) as f:
            assert f.read() == "made\n"  # the workspace itself is served, writable


def test_a_workspace_that_is_an_entry_of_another_home_is_refused(monkeypatch, tmp_path):
    other = tmp_path / "other-user"
    (other / ".gnupg" / "private").mkdir(parents=True)
    monkeypatch.setattr(home_module, "other_homes", lambda own: [str(other)])
    why = workspace_rules.refusal(str(other / ".gnupg" / "private"),
                                  own_home=str(tmp_path / "me"))
    assert why is not None and f"lies inside {other}/.gnupg," in why
    assert workspace_rules.refusal(str(other), own_home=str(tmp_path / "me")) is None


# ------------------------------------------------ folders that hold the daemon's own


def test_a_workspace_that_holds_the_state_folder_is_served_with_it_hidden():
    root = short_tempdir()
    proj = os.path.join(root, "proj")
    d = RunningDaemon(root)
    d.state_dir = os.path.join(proj, "toolsd-state")  # and the HOME lies outside proj
    write(os.path.join(proj, "main.py"), "print('hi')\n")
    d.start()
    try:
        with d.client() as c:
            other = c.session_open(d.workspace)["session"]
            c.shell_run(other, "echo OTHER-SESSION-SCRATCH > /tmp/mine.txt")
            s = c.session_open(proj)["session"]
            r = c.shell_run(s, "python3 main.py; ls -A toolsd-state | wc -l; "
                               "grep -r OTHER-SESSION . ; echo ok > new.txt; ls ~/notes.txt")
            assert r["output"] == f"hi\n0\n{d.home}/notes.txt\n", r
            c.session_close(s)
            c.session_close(other)
        with open(os.path.join(proj, "new.txt")) as f:
            assert f.read() == "ok\n"
    finally:
        assert d.stop() == 0, d.read_log()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def in_host_tmp():
    """A daemon whose socket and state are in the host's /tmp (as by default), and a folder
    of the test's own there."""
    root = short_tempdir()
    run = tempfile.mkdtemp(prefix="toolsd-t-", dir="/tmp")
    mine = tempfile.mkdtemp(prefix="toolsd-ws-", dir="/tmp")
    d = RunningDaemon(root)
    d.socket = os.path.join(run, "toolsd.sock")
    d.state_dir = os.path.join(run, "state")
    d.mine = mine
    write(os.path.join(mine, "host.txt"), "FROM-THE-HOST\n")
    d.start()
    try:
        yield d
    finally:
        assert d.stop() == 0, d.read_log()
        for folder in (root, run, mine):
            shutil.rmtree(folder, ignore_errors=True)


def test_tmp_as_the_workspace_is_the_hosts_tmp_with_the_daemons_folders_hidden(in_host_tmp):
    d = in_host_tmp
    run = os.path.dirname(d.socket)
    with d.client() as c:
        other = c.session_open(d.workspace)["session"]
        c.shell_run(other, "echo OTHER-SESSION-SCRATCH > /tmp/mine.txt")
        s = c.session_open("/tmp")["session"]
        r = c.shell_run(s, f"cat {d.mine}/host.txt; echo made > {d.mine}/made.txt; "
                           f"ls -A {run} | wc -l; cat /tmp/mine.txt; echo TMPDIR=$TMPDIR")
        assert r["output"].startswith(f"FROM-THE-HOST\n0\ncat: /tmp/mine.txt: No such file")
        assert r["output"].endswith("TMPDIR=/tmp\n"), r
        # A cut output kept whole is the session's own, where the session can read it.
        cut = c.shell_run(s, "seq 100000", max_output_chars=100, spill=True)
        assert not cut["output_file"].startswith("/tmp/"), cut["output_file"]
        back = c.shell_run(s, f"tail -n 1 {cut['output_file']}")
        assert back["output"] == "100000\n", back
        c.session_close(s)
        c.session_close(other)
    with open(os.path.join(d.mine, "made.txt")) as f:
        assert f.read() == "made\n"


def test_exec_cli_works_in_tmp(in_host_tmp):
    d = in_host_tmp
    out = subprocess.run(
        [sys.executable, "-m", "toolsd", "--socket", d.socket, "exec", "--workspace", "/tmp",
         "--", f"cat {d.mine}/host.txt"],
        capture_output=True, text=True, timeout=120, env=d.env)
    assert out.returncode == 0 and out.stdout == "FROM-THE-HOST\n", out


async def test_mcp_on_tmp_with_a_daemon_of_its_own_in_tmp(in_host_tmp):
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client

    d = in_host_tmp
    # No daemon answers at TOOLSD_SOCKET: `toolsd mcp` starts its own, in TMPDIR (/tmp).
    env = {**d.env, "TOOLSD_SOCKET": os.path.join(d.root, "none.sock"), "TMPDIR": "/tmp"}
    params = StdioServerParameters(command=sys.executable, env=env,
                                   args=["-m", "toolsd", "mcp", "--workspace", "/tmp"])
    with open(os.path.join(d.root, "mcp.log"), "a") as log:
        async with Client(stdio_client(params, errlog=log)) as client:
            result = await client.call_tool("run_terminal", {"command": f"cat {d.mine}/host.txt"})
    assert not result.is_error, result
    assert [c.text for c in result.content] == ["FROM-THE-HOST\n[exit code 0]"]
