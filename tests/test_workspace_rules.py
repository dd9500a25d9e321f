"""Which folders a session may work in: a hidden path (an entry the homes hide, a --hide path,
the daemon's own folders) is refused as a workspace, and so is a folder inside one, however
it is named; a workspace that holds hidden paths is served with them hidden; /tmp and a
folder that holds the daemon's state are served, the daemon's folders hidden in them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from conftest import RunningDaemon, needs_bwrap, short_tempdir
from toolsd.client import ToolsdError
from toolsd.sandbox.bwrap import home as home_module
from toolsd.sandbox.bwrap import workspace_rules
ENTRIES = (*home_module.SECRETS, *home_module.OWN)


def write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def hidden_entries(d) -> None:
    """The daemon's (fake) HOME holds every hidden entry as a folder with a token in it,
    except ~/.kube, a symlink to dotfiles/kube; and it is given a --hide folder."""
    d.extra_args += ("--hide", os.path.join(d.root, "vault"))
    for i, entry in enumerate(ENTRIES):
        if entry != ".kube":
            write(os.path.join(d.home, entry, "token"), f"HIDDEN-TOKEN-{i}\n")
    write(os.path.join(d.home, "dotfiles", "kube", "config"), "HIDDEN-TOKEN-KUBE\n")
    os.symlink("dotfiles/kube", os.path.join(d.home, ".kube"))
    os.makedirs(os.path.join(d.home, "proj"))
    write(os.path.join(d.root, "vault", "key"), "HIDDEN-TOKEN-VAULT\n")


pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True, prepare=hidden_entries)]


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


def test_run_and_its_folders_are_refused(daemon, client):
    # /run holds the host's service sockets (D-Bus, agents, $XDG_RUNTIME_DIR).
    inner = [e.path for e in os.scandir("/run") if e.is_dir(follow_symlinks=False)]
    for path in ["/run", *inner[:1]]:
        why = refusal(client, path)
        assert "(the host's service sockets, hidden from every session)" in why, why


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


def test_the_hosts_tmp_is_refused_saying_what_to_do(daemon, client):
    why = refusal(client, "/tmp")
    assert "other programs keep their sockets" in why and "mkdir /tmp/work" in why, why
    out = subprocess.run(
        [sys.executable, "-m", "toolsd", "--socket", daemon.socket, "exec", "--workspace",
         "/tmp", "--", "true"], capture_output=True, text=True, timeout=120, env=daemon.env)
    assert out.returncode != 0 and "mkdir /tmp/work" in out.stderr, out


async def test_mcp_on_a_folder_that_holds_its_own_daemons_state():
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client

    # `toolsd mcp` finds no daemon and starts its own in TMPDIR, here inside the workspace;
    # the HOME lies elsewhere, so the session's home (in the daemon's state) is in the
    # workspace too.
    ws, home = short_tempdir(), short_tempdir()
    try:
        os.makedirs(os.path.join(ws, "tmp"))
        write(os.path.join(ws, "main.py"), "print('hi')\n")
        env = {k: v for k, v in os.environ.items() if k not in ("TOOLSD_SOCKET", "XDG_RUNTIME_DIR")}
        env.update(HOME=home, TMPDIR=os.path.join(ws, "tmp"),
                   TOOLSD_SOCKET=os.path.join(ws, "none.sock"))
        params = StdioServerParameters(command=sys.executable, env=env,
                                       args=["-m", "toolsd", "mcp", "--workspace", ws])
        with open(os.path.join(home, "mcp.log"), "a") as log:
            async with Client(stdio_client(params, errlog=log)) as client:
                result = await client.call_tool(
                    "run_terminal", {"command": "python3 main.py; ls -A tmp/*/ | wc -l"})
        assert not result.is_error, result
        assert [c.text for c in result.content] == ["hi\n0\n[exit code 0]"]
    finally:
        shutil.rmtree(ws, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
