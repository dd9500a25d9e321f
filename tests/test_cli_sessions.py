"""A session kept between CLI commands (`toolsd open`, `exec --session`, `start`, `repl
--session`, `close`), and what `toolsd exec` says beside the output."""

from __future__ import annotations

import os

import pexpect
import psutil
import pytest

from _cli import toolsd, toolsd_at_terminal
from conftest import needs_bwrap, wait_gone

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]


def open_session(daemon, *args: str) -> str:
    r = toolsd(daemon, "open", *args)
    assert r.returncode == 0, r.stderr
    session = r.stdout.strip()
    assert r.stdout == f"{session}\n"  # the id alone: S=$(toolsd open)
    assert f"toolsd close {session}" in r.stderr
    return session


def test_commands_given_the_session_share_it_and_close_ends_its_processes(daemon, client):
    session = open_session(daemon)
    # The session's /tmp is its own: what one command leaves there the next one finds.
    wrote = toolsd(daemon, "exec", "--session", session, "--", "echo kept > /tmp/mark")
    assert wrote.returncode == 0, wrote.stderr
    assert toolsd(daemon, "exec", "--session", session, "--", "cat /tmp/mark").stdout == "kept\n"
    assert "No such file" in toolsd(daemon, "exec", "--", "cat /tmp/mark").stdout
    assert [s["session"] for s in client.session_list()["sessions"]] == [session]

    started = toolsd(daemon, "start", "--session", session, "--name", "napper", "--",
                     "sleep", "1000")
    assert started.returncode == 0, started.stderr
    process = started.stdout.strip()
    assert f"toolsd logs -f {process}" in started.stderr
    [info] = client.process_list(session)["processes"]
    assert (info["id"], info["name"], info["status"]) == (process, "napper", "running")
    pid = psutil.Process(info["pid"])

    closed = toolsd(daemon, "close", session)
    assert closed.returncode == 0, closed.stderr
    assert closed.stdout == f"{session} closed: stopped 1 process and 0 REPLs\n"
    assert wait_gone([pid], timeout=30) == []
    assert client.session_list()["sessions"] == []
    again = toolsd(daemon, "close", session)
    assert again.returncode == 1 and "toolsd status" in again.stderr


def test_a_kept_session_is_given_with_no_options_of_its_own(daemon, client):
    session = open_session(daemon, "--read-only")
    r = toolsd(daemon, "exec", "--session", session, "--network", "host", "--", "true")
    assert r.returncode == 2
    assert f"--network: session {session} was opened with its own" in r.stderr
    refused = toolsd(daemon, "exec", "--session", session, "--", "touch here")
    assert refused.returncode == 1 and "Read-only file system" in refused.stdout
    missing = toolsd(daemon, "open", "--workspace", os.path.join(daemon.workspace, "nope"))
    assert missing.returncode == 2 and "no such folder" in missing.stderr
    client.session_close(session)


def test_open_refuses_without_a_daemon_that_lasts(daemon, daemon_root):
    nowhere = os.path.join(daemon_root, "none.sock")
    r = toolsd(daemon, "open", socket=nowhere)
    assert r.returncode == 1
    assert f"no toolsd answers on {nowhere}" in r.stderr and "toolsd serve" in r.stderr
    assert r.stdout == ""


def test_start_without_a_command_says_how(daemon):
    r = toolsd(daemon, "start", "--session", "s1")
    assert r.returncode == 2 and "give a command after --" in r.stderr


def test_exec_says_what_it_ended_and_what_the_host_would_run(daemon):
    r = toolsd(daemon, "exec", "--", "sleep 1000 & git init -q app && "
                                     "echo 'echo owned' > app/.git/hooks/pre-commit; echo ran")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "ran\n"
    assert "the command left 1 process running; ended when it exited" in r.stderr
    assert "the host's git would run what this session added (1;" in r.stderr
    assert f"  {daemon.workspace}/app/.git/hooks/pre-commit\n" in r.stderr
    quiet = toolsd(daemon, "exec", "--", "echo calm")
    assert quiet.stderr == ""


def test_repl_in_a_kept_session_leaves_it_open(daemon, client):
    session = open_session(daemon)
    child = toolsd_at_terminal(daemon, "repl", "--session", session)
    try:
        child.expect_exact(">>> ")
        child.sendline("open('/tmp/from-repl', 'w').write('typed')")
        child.expect_exact("5\r\n>>> ")
        child.sendeof()
        child.expect_exact(f"`toolsd close {session}` ends it")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    [kept] = client.session_list()["sessions"]
    assert (kept["session"], kept["repls"]) == (session, 0)  # the REPL went with its turn
    shown = toolsd(daemon, "exec", "--session", session, "--", "cat /tmp/from-repl")
    assert shown.stdout == "typed\n"
    client.session_close(session)


def test_repl_on_a_session_closed_meanwhile_says_it_is_gone(daemon, client):
    session = open_session(daemon)
    child = toolsd_at_terminal(daemon, "repl", "--session", session)
    try:
        child.expect_exact(">>> ")
        child.sendline("x = 1")
        child.expect_exact(">>> ")
        assert toolsd(daemon, "close", session).returncode == 0
        child.sendline("x")
        child.expect_exact(f"session {session} is gone")
        child.expect_exact("`toolsd open`")
        child.expect(pexpect.EOF)
        child.close()
    finally:
        child.close(force=True)
    assert child.exitstatus == 1
