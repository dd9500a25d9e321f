"""The warm spare: after a session.open the daemon starts one more sandbox for the same
parameters, and the next session.open that asks for exactly that sandbox takes it. It must
be indistinguishable from a sandbox started on demand: never one made for another policy,
nor for a folder that has since been replaced, nor one that a new credential folder would
escape; and it ends with the daemon."""

from __future__ import annotations

import os
import shutil
import time

import psutil
import pytest

from conftest import RunningDaemon, needs_bwrap, wait_for, wait_gone

# Each test its own daemon, verbose: its log says when the spare is ready (spare_ready).
pytestmark = [needs_bwrap, pytest.mark.daemon("--verbose", warm_spare=True)]


def sandboxes(daemon) -> list[psutil.Process]:
    """The outer bwrap of every sandbox of the daemon (sessions' and the spare's)."""
    procs = daemon.tree()
    bwraps = {p.pid for p in procs if p.name() == "bwrap"}
    return [p for p in procs if p.pid in bwraps and p.ppid() not in bwraps]


def sandbox_of(daemon, client, session) -> int:
    """The pid of the outer bwrap that a session's commands run under."""
    marker = f"sleep 1000.{time.monotonic_ns()}"  # found on the host by its command line
    bg = client.process_start(session, marker)["id"]
    try:
        # bash execs sleep: until it has, the command line matches a bash.
        def sleeps():
            return [p for p in daemon.running(marker) if p.name() == "sleep"]
        wait_for(sleeps)
        (proc,) = sleeps()
        outer = {p.pid for p in sandboxes(daemon)}
        for ancestor in proc.parents():
            if ancestor.pid in outer:
                return ancestor.pid
        raise AssertionError("the session's commands run under no sandbox of the daemon")
    finally:
        client.process_stop(bg)


def spare_ready(daemon, client, session) -> int:
    """Wait until the spare is up next to `session`; its bwrap's pid."""
    wait_for(lambda: len(sandboxes(daemon)) == 2)
    mine = sandbox_of(daemon, client, session)
    (spare,) = [p.pid for p in sandboxes(daemon) if p.pid != mine]
    # Ready means the daemon has its launcher's word and holds it as the spare: one still
    # starting is not offered (the launcher's process is there well before, on a busy
    # machine long enough for the next session.open to start its own sandbox).
    wait_for(lambda: "warm spare spare1 is ready" in daemon.read_log())
    return spare


def test_the_next_session_takes_the_spare_and_it_is_a_whole_session(daemon, client):
    first = client.session_open(daemon.workspace)["session"]
    spare = spare_ready(daemon, client, first)
    client.shell_run(first, "echo from-first > /tmp/left-in-first-tmp")
    assert client.session_close(first)
    second = client.session_open(daemon.workspace)["session"]
    assert second != first
    assert sandbox_of(daemon, client, second) == spare
    r = client.shell_run(second, "touch made && ls /tmp && ls ~/.ssh; echo $?")
    assert os.path.exists(os.path.join(daemon.workspace, "made"))
    assert "left-in-first-tmp" not in r["output"]  # its own scratch /tmp
    assert "id_rsa" not in r["output"]  # credentials hidden as in any session
    assert [s["session"] for s in client.call("session.list")["sessions"]] == [second]
    turn = client.turn_begin(second)["turn"]
    assert client.repl_exec(second, turn, "6 * 7")["output"] == "42\n"


def test_a_spare_made_for_another_policy_is_not_used(daemon, client):
    first = client.session_open(daemon.workspace)["session"]
    spare = spare_ready(daemon, client, first)
    spare_proc = psutil.Process(spare)
    read_only = client.session_open(daemon.workspace, writable=False)["session"]
    assert sandbox_of(daemon, client, read_only) != spare
    r = client.shell_run(read_only, "touch nope")
    assert r["exit_code"] != 0 and "Read-only" in r["output"]
    assert wait_gone([spare_proc], timeout=30) == []  # the unused one is closed


def test_a_spare_is_not_used_once_its_workspace_was_replaced(daemon, client):
    first = client.session_open(daemon.workspace)["session"]
    spare = spare_ready(daemon, client, first)
    client.session_close(first)
    shutil.rmtree(daemon.workspace)
    os.makedirs(daemon.workspace)
    with open(os.path.join(daemon.workspace, "new-file"), "w") as f:
        f.write("new\n")
    # The spare still shows the folder that was removed: it must not serve this session.
    second = client.session_open(daemon.workspace)["session"]
    assert sandbox_of(daemon, client, second) != spare
    assert client.shell_run(second, "cat new-file")["output"] == "new\n"


def test_a_credential_folder_made_after_the_spare_is_hidden_all_the_same(daemon, client):
    # Nothing of a secret's path is mounted in a home: a spare made before ~/.aws existed
    # shows it no more than a sandbox made now, so it may serve the session.
    first = client.session_open(daemon.workspace)["session"]
    spare_ready(daemon, client, first)
    aws = os.path.join(daemon.home, ".aws")
    os.makedirs(aws)
    with open(os.path.join(aws, "credentials"), "w") as f:
        f.write("AWS-SECRET\n")
    second = client.session_open(daemon.workspace)["session"]
    r = client.shell_run(second, "cat ~/.aws/credentials; echo rc=$?")
    assert "AWS-SECRET" not in r["output"] and "rc=1" in r["output"]


def test_a_spare_is_not_used_once_the_home_got_a_new_entry(daemon, client):
    # The home shows the entries it had when the sandbox started: a spare made before a
    # toolchain was installed would not show it.
    first = client.session_open(daemon.workspace)["session"]
    spare = spare_ready(daemon, client, first)
    os.makedirs(os.path.join(daemon.home, ".newtool"))
    with open(os.path.join(daemon.home, ".newtool", "version"), "w") as f:
        f.write("1.0\n")
    second = client.session_open(daemon.workspace)["session"]
    assert sandbox_of(daemon, client, second) != spare
    assert client.shell_run(second, "cat ~/.newtool/version")["output"] == "1.0\n"


def test_a_spare_is_not_used_once_a_home_entry_was_replaced(daemon, client):
    first = client.session_open(daemon.workspace)["session"]
    spare = spare_ready(daemon, client, first)
    notes = os.path.join(daemon.home, "notes.txt")
    with open(notes + ".new", "w") as f:
        f.write("NEW-NOTE\n")
    os.rename(notes + ".new", notes)  # as editors save: the spare binds the old file
    second = client.session_open(daemon.workspace)["session"]
    assert sandbox_of(daemon, client, second) != spare
    assert client.shell_run(second, "cat ~/notes.txt")["output"] == "NEW-NOTE\n"


def test_a_hidden_folder_replaced_after_the_spare_is_hidden_all_the_same(daemon_root):
    # Replacing a folder hidden where it is (--hide outside any home) removes the spare's
    # tmpfs over it (the kernel detaches mounts on a removed path in every namespace), and
    # the new folder may get the old inode number: what is checked is the spare's own mounts.
    vault = os.path.join(daemon_root, "vault")
    os.makedirs(vault)
    d = RunningDaemon(daemon_root, ("--verbose", "--hide", vault), warm_spare=True).start()
    try:
        with d.client() as client:
            first = client.session_open(d.workspace)["session"]
            spare = spare_ready(d, client, first)
            shutil.rmtree(vault)
            os.makedirs(vault)
            with open(os.path.join(vault, "key"), "w") as f:
                f.write("NEW-VAULT-SECRET\n")
            second = client.session_open(d.workspace)["session"]
            assert sandbox_of(d, client, second) != spare
            r = client.shell_run(second, f"cat {vault}/key")
            assert "NEW-VAULT-SECRET" not in r["output"]
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_spare_that_died_is_not_handed_out(daemon, client):
    first = client.session_open(daemon.workspace)["session"]
    spare = spare_ready(daemon, client, first)
    launcher = [p for p in psutil.Process(spare).children(recursive=True)
                if p.name() != "bwrap"][0]
    launcher.kill()
    second = client.session_open(daemon.workspace)["session"]  # at once: nobody noticed yet
    assert client.shell_run(second, "echo works")["output"] == "works\n"


def test_stopping_the_daemon_ends_the_spare_too(daemon, client):
    first = client.session_open(daemon.workspace)["session"]
    spare_ready(daemon, client, first)
    everything = daemon.tree()
    assert daemon.stop() == 0
    assert wait_gone(everything, timeout=30) == []
