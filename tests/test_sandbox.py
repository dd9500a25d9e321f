"""What a session's commands can and cannot reach, tried as a hostile command would."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile

import psutil
import pytest

from conftest import HAVE_BWRAP, wait_for
from toolsd.client import Client, ToolsdError
from toolsd.sandbox.session_sandbox import SPAWN_TIMEOUT_S

pytestmark = [pytest.mark.skipif(not HAVE_BWRAP, reason="bubblewrap (bwrap) is not installed"),
              pytest.mark.daemon(shared=True)]


@pytest.fixture
def outside():
    """A host folder outside the workspace (not under /tmp, which sessions get privately, nor
    in a home folder, which shows only what it had when the session started)."""
    path = tempfile.mkdtemp(prefix="toolsd-outside-", dir="/var/tmp")
    yield path
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def test_session_is_sandboxed(client, session):
    assert client.hello()["sandbox"] == "bwrap"
    assert client.session_list()["sessions"][0]["sandbox"] == "bwrap"


def test_write_inside_works_outside_fails(daemon, client, session, outside):
    r = client.shell_run(session, f"echo data > inside.txt && echo ok; "
                                  f"echo x > {outside}/escaped.txt; echo rc=$?")
    assert r["output"].startswith("ok\n")
    assert "rc=1" in r["output"] and "Read-only file system" in r["output"]
    with open(os.path.join(daemon.workspace, "inside.txt")) as f:
        assert f.read() == "data\n"
    assert not os.path.exists(os.path.join(outside, "escaped.txt"))


def test_symlink_out_of_the_workspace_cannot_be_written_through(daemon, client, session, outside):
    os.symlink(outside, os.path.join(daemon.workspace, "link"))
    r = client.shell_run(session, "echo x > link/escaped.txt; echo rc=$?")
    assert "rc=1" in r["output"]
    assert not os.path.exists(os.path.join(outside, "escaped.txt"))


def test_read_only_session_refuses_every_write(daemon, client):
    with open(os.path.join(daemon.workspace, "existing.txt"), "w") as f:
        f.write("keep\n")
    s = client.session_open(daemon.workspace, writable=False)["session"]
    attempts = [
        "echo x > new.txt",
        "echo x >> existing.txt",
        "rm existing.txt",
        "mkdir d",
        "python3 -c \"open('existing.txt','w')\"",
        "mv existing.txt moved.txt",
        "touch existing.txt",
    ]
    for cmd in attempts:
        r = client.shell_run(s, cmd)
        assert r["exit_code"] != 0, cmd
        assert "Read-only file system" in r["output"] or "read-only" in r["output"].lower(), cmd
    with open(os.path.join(daemon.workspace, "existing.txt")) as f:
        assert f.read() == "keep\n"
    assert sorted(os.listdir(daemon.workspace)) == ["existing.txt"]
    # /tmp stays writable: tools need scratch space even in a read-only session.
    assert client.shell_run(s, "echo x > /tmp/t && cat /tmp/t")["output"] == "x\n"


def test_credentials_are_hidden(daemon, client, session):
    r = client.shell_run(session, f"cat {daemon.home}/notes.txt; ls -A {daemon.home}/.ssh; "
                                  f"cat {daemon.home}/.ssh/id_rsa; echo rc=$?")
    assert r["output"].startswith("PUBLIC-NOTE\n")  # HOME is visible, only .ssh is hidden
    assert "SECRET-KEY" not in r["output"]
    assert "rc=1" in r["output"]


def test_symlink_to_credentials_reads_nothing(daemon, client, session):
    os.symlink(os.path.join(daemon.home, ".ssh"), os.path.join(daemon.workspace, "keys"))
    r = client.shell_run(session, "cat keys/id_rsa; echo rc=$?")
    assert "SECRET-KEY" not in r["output"] and "rc=1" in r["output"]


def test_daemon_socket_and_state_are_unreachable(daemon, client, session):
    code = ("import socket,sys\n"
            "s=socket.socket(socket.AF_UNIX)\n"
            "try:\n"
            f"    s.connect({daemon.socket!r}); print('CONNECTED')\n"
            "except OSError as e: print('refused', e.errno)\n")
    r = client.shell_run(session, f"python3 -c \"{code}\"; ls -A {daemon.state_dir} | wc -l")
    assert "CONNECTED" not in r["output"]
    assert "refused" in r["output"]
    assert r["output"].strip().endswith("0")  # the state folder is an empty tmpfs inside


def test_git_hooks_and_config_are_protected(daemon, client):
    os.makedirs(os.path.join(daemon.workspace, ".git", "hooks"))
    open(os.path.join(daemon.workspace, ".git", "config"), "w").close()
    s = client.session_open(daemon.workspace)["session"]
    r = client.shell_run(s, "echo evil > .git/hooks/pre-commit; echo rc=$?; "
                            "echo '[core]' >> .git/config; echo rc=$?; "
                            "echo fine > .git/HEAD; echo rc=$?")
    assert r["output"].count("rc=1") == 2 and r["output"].endswith("rc=0\n")
    assert not os.path.exists(os.path.join(daemon.workspace, ".git", "hooks", "pre-commit"))
    assert os.path.getsize(os.path.join(daemon.workspace, ".git", "config")) == 0


def test_git_config_rewritten_on_the_host_ends_the_session(daemon, client):
    # `git config` on the host renames a new .git/config into place; the kernel then drops
    # the sandbox's read-only mount on that path, and .git/config would be writable from
    # the session (core.fsmonitor: code run by the host's git). The session is ended.
    os.makedirs(os.path.join(daemon.workspace, ".git", "hooks"))
    config = os.path.join(daemon.workspace, ".git", "config")
    open(config, "w").close()
    s = client.session_open(daemon.workspace)["session"]
    assert "rc=0" not in client.shell_run(s, "echo x >> .git/config; echo rc=$?")["output"]
    with open(config + ".lock", "w") as f:
        f.write("[user]\n\tname = host\n")
    os.rename(config + ".lock", config)

    def ended() -> bool:
        try:
            client.shell_run(s, "true")
        except ToolsdError as e:
            assert e.code == "session_closed" and ".git/config" in e.message, e.message
            return True
        return False

    wait_for(ended)
    with open(config) as f:
        assert f.read() == "[user]\n\tname = host\n"


@pytest.mark.daemon(shared=False)  # it changes the daemon's HOME
def test_a_credential_folder_replaced_on_the_host_stays_hidden(daemon, client, session):
    # The session's home shows what the host's had at open, less the secrets: nothing of
    # ~/.ssh is mounted, so a new one made on the host has nothing to uncover either.
    ssh = os.path.join(daemon.home, ".ssh")
    shutil.rmtree(ssh)
    os.makedirs(ssh)
    with open(os.path.join(ssh, "id_rsa"), "w") as f:
        f.write("NEW-SECRET-KEY\n")
    r = client.shell_run(session, "cat ~/.ssh/id_rsa; echo rc=$?; cat ~/notes.txt")
    assert "NEW-SECRET-KEY" not in r["output"]
    assert "rc=1" in r["output"] and r["output"].endswith("PUBLIC-NOTE\n")


@pytest.mark.daemon(shared=False)  # it changes the daemon's HOME
def test_the_home_folder_replaced_on_the_host_ends_the_session(daemon, client, session):
    # The session's home is a mount on the host's home folder: moved away on the host, the
    # path would show the host's new folder as it is.
    os.rename(daemon.home, daemon.home + ".old")
    os.makedirs(daemon.home)
    with open(os.path.join(daemon.home, ".npmrc"), "w") as f:
        f.write("NEW-TOKEN\n")
    with pytest.raises(ToolsdError) as e:
        wait_for(lambda: "NEW-TOKEN" in client.shell_run(session, "cat ~/.npmrc")["output"])
    assert e.value.code == "session_closed" and daemon.home in e.value.message


def test_host_processes_are_invisible_and_unsignallable(daemon, client, session):
    r = client.shell_run(session, f"ps -e -o pid= | wc -l; kill -0 {daemon.proc.pid}; "
                                  f"echo rc=$?")
    count = int(r["output"].split()[0])
    assert count < 10  # the sandbox's own few processes, not the host's hundreds
    assert "rc=1" in r["output"]
    assert daemon.proc.poll() is None


def test_network_none_cannot_reach_host_loopback(client, session):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    try:
        code = ("import socket\n"
                "try:\n"
                f"    socket.create_connection(('127.0.0.1', {port}), timeout=5); print('REACHED')\n"
                "except OSError as e: print('blocked', e)\n")
        r = client.shell_run(session, f"python3 -c \"{code}\"")
        assert "REACHED" not in r["output"] and "blocked" in r["output"]
    finally:
        listener.close()


def test_server_of_one_command_reachable_from_another(client, session):
    started = client.process_start(
        session, "python3 -m http.server 18765 --bind 127.0.0.1", name="web")
    try:
        ready = client.process_output(started["id"], wait_s=30, until="Serving HTTP")
        assert "Serving HTTP" in ready["output"]
        code = ("import urllib.request\n"
                "print(urllib.request.urlopen('http://127.0.0.1:18765/').status)\n")
        r = client.shell_run(session, f"python3 -c \"{code}\"")
        assert r["output"] == "200\n"
    finally:
        client.process_stop(started["id"])


def test_network_host_reaches_host_loopback(daemon, client):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    try:
        s = client.session_open(daemon.workspace, network="host")["session"]
        code = (f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5); "
                f"print('REACHED')")
        assert client.shell_run(s, f"python3 -c \"{code}\"")["output"] == "REACHED\n"
    finally:
        listener.close()


def test_tmp_is_private_to_the_session(daemon, client):
    a = client.session_open(daemon.workspace)["session"]
    b = client.session_open(daemon.workspace)["session"]
    client.shell_run(a, "echo mine > /tmp/note")
    assert client.shell_run(b, "cat /tmp/note; echo rc=$?")["output"].endswith("rc=1\n")
    assert client.shell_run(a, "cat /tmp/note")["output"] == "mine\n"


def test_kernel_settings_are_read_only(client, session):
    # Writes back the value it read: harmless even if the protection were missing.
    r = client.shell_run(session, "v=$(cat /proc/sys/vm/swappiness); "
                                  "echo $v > /proc/sys/vm/swappiness; echo rc=$?; "
                                  "cat /proc/sys/kernel/core_pattern > /proc/sys/kernel/core_pattern; "
                                  "echo rc=$?")
    assert r["output"].count("rc=1") == 2, r["output"]
    assert "Read-only file system" in r["output"]


def test_host_service_sockets_in_run_are_unreachable(client, session):
    path = f"/run/toolsd-test-{os.getpid()}.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(1)
    try:
        code = ("import socket\n"
                "s = socket.socket(socket.AF_UNIX)\n"
                "try:\n"
                f"    s.connect({path!r}); print('CONNECTED')\n"
                "except OSError as e: print('refused', e.errno)\n")
        r = client.shell_run(session, f"python3 -c \"{code}\"")
        assert "CONNECTED" not in r["output"] and "refused" in r["output"]
    finally:
        server.close()
        os.unlink(path)


def test_git_folder_cannot_be_swapped_for_one_with_hostile_config(daemon, client):
    os.makedirs(os.path.join(daemon.workspace, ".git", "hooks"))
    with open(os.path.join(daemon.workspace, ".git", "config"), "w") as f:
        f.write("[core]\n")
    s = client.session_open(daemon.workspace)["session"]
    r = client.shell_run(s, "mv .git .git-old; echo rc=$?; rm -rf .git; echo rc=$?; ls -a")
    assert "cannot move '.git'" in r["output"] and "rc=0" not in r["output"]
    assert os.path.isdir(os.path.join(daemon.workspace, ".git", "hooks"))
    with open(os.path.join(daemon.workspace, ".git", "config")) as f:
        assert f.read() == "[core]\n"


def test_stopping_the_launcher_and_its_shims_from_inside_changes_nothing(daemon, client):
    s = client.session_open(daemon.workspace)["session"]
    # Freeze the launcher and its spare shims (every copy of driver/launcher.py but the shim
    # of this very command, $PPID): pid 1 ignores it, and the launcher resumes its shims.
    client.shell_run(s, "for p in $(pgrep -f driver/launcher.py); do "
                        "[ $p != $PPID ] && kill -STOP $p; done; true", timeout_s=5)
    assert client.shell_run(s, "echo works", timeout_s=60)["output"] == "works\n"


def test_image_read_on_a_stopped_launcher_says_session_closed(daemon, client):
    # image.read starts its reader through the launcher as every tool does, so a launcher
    # that no longer answers ends the session after the spawn timeout, as for shell.run; the
    # call must not wait for ever. Stopped from the host: from inside, pid 1 ignores it.
    s = client.session_open(daemon.workspace)["session"]
    with open(os.path.join(daemon.workspace, "a.png"), "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
    assert client.shell_run(s, "true")["exit_code"] == 0
    launchers = [p for p in daemon.tree() if p.cmdline()[1:3] == ["-I", "-S"]]
    assert launchers
    for p in launchers:
        p.suspend()
    try:
        # A bound, not a speed: without the spawn timeout the call never returns.
        with Client(daemon.socket, timeout=SPAWN_TIMEOUT_S + 60) as waiting:
            with pytest.raises(ToolsdError) as e:
                waiting.image_read(s, "a.png")
        assert e.value.code == "session_closed", e.value.message
        with pytest.raises(ToolsdError) as e:
            client.shell_run(s, "true")
        assert e.value.code == "session_closed"
    finally:
        for p in launchers:
            with contextlib.suppress(psutil.Error):
                p.resume()
